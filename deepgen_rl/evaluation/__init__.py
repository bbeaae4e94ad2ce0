"""Evaluation: eval YAML + prompt files, eval image generation, UniGenBench judge client, metrics and reports.

Entry points: :func:`load_eval_config`, :func:`generate_eval_images`, :func:`run_unigenbench_eval` (trainer),
``python -m deepgen_rl.evaluation.unigenbench`` (score an existing image folder).
Names are imported lazily so the standalone judge CLI does not import torch.
"""

from importlib import import_module

_EXPORTS = {
    "config": ["EvalDatasetSpec", "EvalPrompt", "EvalTestPoint", "MalformedRow", "load_eval_config",
               "load_prompt_file", "load_unigenbench_csv"],
    "generate": ["EvalImageRecord", "generate_eval_images", "item_seed"],
    "judge_prompt": ["MalformedAnswer", "OfficialLayoutError", "load_judge_template", "load_official_template",
                     "parse_answer"],
    "metrics": ["compute_unigenbench_summary", "summary_to_metrics", "write_eval_reports"],
    "runner": ["run_unigenbench_eval"],
    "unigenbench": ["JudgeConfig", "Judgment", "UniGenBenchJudge", "protocol_info", "score_image_folder"],
}
_WHERE = {name: mod for mod, names in _EXPORTS.items() for name in names}
__all__ = sorted(_WHERE)


def __getattr__(name):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{_WHERE[name]}"), name)
