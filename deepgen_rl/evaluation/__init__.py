"""Evaluation: eval YAML + prompt files, eval image generation, UniGenBench judge client, metrics and reports.

Entry points: :func:`load_eval_config`, :func:`generate_eval_images`, :func:`run_unigenbench_eval` (trainer),
``python -m deepgen_rl.evaluation.unigenbench`` (score an existing image folder).
"""

from deepgen_rl.evaluation.config import (
    EvalDatasetSpec,
    EvalPrompt,
    EvalTestPoint,
    MalformedRow,
    load_eval_config,
    load_prompt_file,
    load_unigenbench_csv,
)
from deepgen_rl.evaluation.generate import EvalImageRecord, generate_eval_images, item_seed
from deepgen_rl.evaluation.metrics import compute_unigenbench_summary, summary_to_metrics
from deepgen_rl.evaluation.runner import run_unigenbench_eval
from deepgen_rl.evaluation.unigenbench import JudgeConfig, Judgment, UniGenBenchJudge, score_image_folder

__all__ = [
    "EvalDatasetSpec", "EvalPrompt", "EvalTestPoint", "MalformedRow", "load_eval_config", "load_prompt_file",
    "load_unigenbench_csv", "EvalImageRecord", "generate_eval_images", "item_seed", "compute_unigenbench_summary",
    "summary_to_metrics", "run_unigenbench_eval", "JudgeConfig", "Judgment", "UniGenBenchJudge", "score_image_folder",
]
