"""One eval step for the trainer: generate on every rank, judge on every rank, all-gather, report on rank 0.

Scheme (no rank waits in a collective while another rank judges everything):

1. every rank generates its shard of every dataset (:func:`generate_eval_images`);
2. every rank judges its OWN images (its thread pool talks to the judge server);
3. ONE ``gather_fn`` all-gathers the per-image records and verdicts (small dicts) to every rank;
4. every rank computes the same metrics; rank 0 writes ``unigenbench_summary.json``, ``unigenbench_dimensions.csv``,
   ``judgments.jsonl`` and ``index.html`` to ``out_root/step_<step>/``; then ``barrier_fn``.

Each dataset is generated at its own ``height``/``width`` from the eval YAML when set, else at the caller's
(training) resolution; the summary records it (``image_size``) along with the judge protocol (``protocol``).

Ranks still meet in the gather, so the slowest rank's judging bounds the wait (shards are equal-sized). An
unreachable judge is detected by one probe per rank and every judgment is recorded as failed (counted), so training
continues. ``barrier_fn``/``gather_fn`` hide torch.distributed (``dist.barrier`` and a wrapper around
``dist.all_gather_object``); the defaults are the single-process identities.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable, Sequence

from deepgen_rl.evaluation.config import EvalDatasetSpec
from deepgen_rl.evaluation.generate import generate_eval_images
from deepgen_rl.evaluation.metrics import (
    compute_unigenbench_summary,
    is_judged_summary,
    summary_to_metrics,
    write_eval_reports,
)
from deepgen_rl.evaluation.unigenbench import JudgeConfig, JudgeRequest, Judgment, UniGenBenchJudge
from deepgen_rl.rl.samplers import DEFAULT_SDE_ETA, DEFAULT_SDE_SAMPLER

logger = logging.getLogger(__name__)


def eval_step_dir(out_root: str | Path, step: int) -> Path:
    return Path(out_root) / f"step_{step}"


def run_unigenbench_eval(model, eval_specs: Sequence[EvalDatasetSpec], out_root: str | Path, step: int, *,
                         rank: int = 0, world_size: int = 1, barrier_fn: Callable[[], None] | None = None,
                         gather_fn: Callable[[Any], list[Any]] | None = None, transformer=None, height: int = 512,
                         width: int = 512, seed: int = 42, judge: bool = True,
                         judge_config: JudgeConfig | None = None, inference_mode: str = "ode", eta: float = DEFAULT_SDE_ETA,
                         sampler: str = DEFAULT_SDE_SAMPLER, batch_size: int = 8, progress: bool = True) -> dict[str, float]:
    """Generate + judge every eval dataset; returns the flat metric dict (same on every rank).

    ``height``/``width``: resolution for datasets whose spec sets none.
    ``gather_fn(obj) -> [obj_rank0, obj_rank1, …]`` must be an all-gather (every rank gets the list).
    With ``judge=False`` (or ``scoring: none``) images are generated and shown in the HTML but not judged.
    """
    barrier_fn = barrier_fn or (lambda: None)
    gather_fn = gather_fn or (lambda obj: [obj])
    step_dir = eval_step_dir(out_root, step)
    step_dir.mkdir(parents=True, exist_ok=True)
    local_records: list[dict] = []
    local_judgments: list[dict] = []
    client = UniGenBenchJudge(judge_config or JudgeConfig.from_env()) if judge else None
    sizes = {spec.name: (spec.height or height, spec.width or width) for spec in eval_specs}
    try:
        if client is not None:  # refuse test points the template cannot render before generating anything
            for spec in eval_specs:
                if spec.language:  # UniGenBench scoring
                    client.check_prompts(spec.prompts, spec.language)
        for spec in eval_specs:
            h, w = sizes[spec.name]
            records = generate_eval_images(model, spec, step_dir, rank=rank, world_size=world_size, height=h,
                                           width=w, inference_mode=inference_mode, eta=eta, sampler=sampler,
                                           seed=seed, transformer=transformer, batch_size=batch_size,
                                           progress=progress)
            local_records += [r.to_dict() for r in records]
            if spec.scoring == "toy":  # programmatic checker (deepgen_rl.toy), no judge server
                from deepgen_rl.toy.evaluate import score_eval_records

                local_judgments += score_eval_records(step_dir, [r.to_dict() for r in records])
                continue
            if client is None or not spec.scoring or not records:
                continue
            items = {p.index: p for p in spec.prompts}
            requests = [JudgeRequest(spec.name, items[r.index], r.dup, step_dir / r.rel_path, r.rel_path)
                        for r in records]
            judgments = client.judge_many(requests, spec.language, progress=progress and rank == 0)
            local_judgments += [j.to_dict() for j in judgments]
        protocol = client.protocol() if client is not None else None
    finally:
        if client is not None:
            client.close()

    gathered = gather_fn((local_records, local_judgments))
    all_records = sorted((r for recs, _ in gathered for r in recs), key=lambda r: (r["dataset"], r["index"], r["dup"]))
    all_judgments = sorted((j for _, js in gathered for j in js), key=lambda j: (j["dataset"], j["index"], j["dup"]))

    summaries: dict[str, dict[str, Any]] = {}
    toy_specs = [spec.name for spec in eval_specs if spec.scoring == "toy"]
    for spec in eval_specs:
        n = sum(r["dataset"] == spec.name for r in all_records)
        size = [{"height": sizes[spec.name][0], "width": sizes[spec.name][1], "num_images": n}]
        if judge and spec.scoring and spec.name not in toy_specs:
            js = [Judgment.from_dict(j) for j in all_judgments if j["dataset"] == spec.name]
            summaries[spec.name] = compute_unigenbench_summary(
                spec.name, spec.prompts, js, language=spec.language, malformed_rows=spec.malformed_rows,
                protocol=protocol, image_size=size)
        else:
            summaries[spec.name] = {"dataset": spec.name, "num_images": n, "image_size": size}
        summaries[spec.name]["step"] = step
    metrics = summary_to_metrics(summaries)
    if toy_specs:
        from deepgen_rl.toy.evaluate import summarize, summary_metrics, write_toy_report

        toy_verdicts = [j for j in all_judgments if j["dataset"] in toy_specs]
        toy_summaries = {ds: summarize([j for j in toy_verdicts if j["dataset"] == ds]) for ds in toy_specs}
        for ds, s in toy_summaries.items():
            metrics.update(summary_metrics(ds, s))
        all_judgments = [j for j in all_judgments if j["dataset"] not in toy_specs]
        if rank == 0:
            write_toy_report(step_dir, toy_summaries, toy_verdicts, title=f"Toy-world eval — step {step}")
    if rank == 0:
        write_eval_reports(step_dir, summaries, {s.name: s.prompts for s in eval_specs}, all_judgments,
                           records=all_records, title=f"UniGenBench eval — step {step}")
        for ds, s in summaries.items():
            if is_judged_summary(s):
                logger.info("eval step %d %s: overall=%s primary_mean_acc=%s testpoint_micro_acc=%s success_rate=%.3f "
                            "failed=%d template=%s", step, ds, s["overall"], s["primary_mean_acc"],
                            s["testpoint_micro_acc"], s["success_rate"], s["num_failed"],
                            s["protocol"]["template"]["kind"])
    barrier_fn()
    return metrics
