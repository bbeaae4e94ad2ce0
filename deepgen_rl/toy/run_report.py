"""The numbers of a toy RL run, read back from its eval folders: the statistics docs/toy_world.md reports.

``python -m deepgen_rl.toy.run_report OUTPUT_DIR [--dataset toy_heldout] [--t0 UNIX_TIME] [--json FILE]``

For every ``OUTPUT_DIR/eval/step_N`` of a run (``eval_freq`` with ``scoring: toy``), against the first eval (step 0
with ``eval_at_start``), per prompt of ``--dataset`` (the mean over its eval images):

  strict        mean over the prompt's images of [all claims pass]; its mean over prompts is held-out strict accuracy
  own           the claim score against the image's own prompt
  other         the claim score against ``--others`` other prompts of the set (`evaluate.other_prompt_scores`):
                what a prompt-blind image scores; ``own − other`` is the part of the score only prompt following raises

Each line gives the mean over prompts and a one-sided exact sign test of "the step raised it" over the prompts whose
value changed (`rl_run.paired_sign_test`: up / down and p; the test's false-positive rate is ≤ α at level α), plus
strict accuracy by caption kind. ``--t0`` (e.g. ``date +%s`` at launch) adds minutes from it to each eval's summary
file; without it the minutes count from the first eval's summary file.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from .evaluate import HELDOUT


def run_statistics(output_dir: str | Path, dataset: str = HELDOUT, n_others: int = 8,
                   t0: float | None = None) -> list[dict[str, Any]]:
    """One dict per eval step of ``output_dir`` (ascending): step, minutes, mean strict / own / other / own − other
    over prompts, each with (up, down, p) against the first eval, and strict accuracy by kind."""
    from .evaluate import SUMMARY_FILE
    from .rl_run import ToyRLResult, mean_over_prompts, paired_sign_test, read_evals

    evals, verdicts = read_evals(output_dir)
    steps = [s for s in sorted(evals) if dataset in evals[s]]
    if not steps:
        found = sorted({d for e in evals.values() for d in e})
        raise ValueError(f"{output_dir}: no eval/step_N/{SUMMARY_FILE} with dataset {dataset!r} "
                         f"(datasets found: {found or 'none'})")
    res = ToyRLResult(history=[], evals=evals, verdicts=verdicts, output_dir=str(output_dir))
    mtime = {s: os.path.getmtime(Path(output_dir, "eval", f"step_{s}", SUMMARY_FILE)) for s in steps}
    origin = t0 if t0 is not None else mtime[steps[0]]
    per_step = {}
    for s in steps:
        strict, own = res.per_prompt(s, dataset, "strict"), res.per_prompt(s, dataset, "score")
        other = res.per_prompt_other(s, dataset, n_others)
        per_step[s] = {"strict": strict, "own": own, "other": other,
                       "own_minus_other": {i: own[i] - other[i] for i in own}}
    first = per_step[steps[0]]
    rows = []
    for s in steps:
        row: dict[str, Any] = {"step": s, "minutes": (mtime[s] - origin) / 60.0,
                               "strict_by_kind": evals[s][dataset]["strict_acc_by_kind"],
                               "claim_acc": evals[s][dataset]["claim_acc"]}
        for key, values in per_step[s].items():
            up, down, p = paired_sign_test(first[key], values)
            row[key] = {"mean": mean_over_prompts(values), "up": up, "down": down, "p": p}
        rows.append(row)
    return rows


def format_table(rows: list[dict[str, Any]]) -> str:
    """A plain-text table of ``run_statistics`` rows (sign tests against the first row)."""
    def cell(r, key):
        c = r[key]
        if r is rows[0]:
            return f"{c['mean']:.3f}"
        return f"{c['mean']:.3f} ({c['up']}/{c['down']}, p {c['p']:.2g})"

    head = ["step", "min", "strict (up/down, p)", "own", "other", "own - other", "strict by kind"]
    lines = ["\t".join(head)]
    for r in rows:
        kinds = " ".join(f"{k} {v:.2f}" for k, v in r["strict_by_kind"].items() if v is not None)
        lines.append("\t".join([str(r["step"]), f"{r['minutes']:.1f}", cell(r, "strict"), cell(r, "own"),
                                f"{r['other']['mean']:.3f}", cell(r, "own_minus_other"), kinds]))
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("output_dir", help="a training run's --output_dir (holds eval/step_N/toy_verdicts.jsonl)")
    p.add_argument("--dataset", default=HELDOUT, help="eval dataset name (default: %(default)s)")
    p.add_argument("--others", type=int, default=8, help="other prompts each image is checked against")
    p.add_argument("--t0", type=float, default=None, help="unix time of the launch; minutes count from it")
    p.add_argument("--json", default=None, help="also write the rows to this JSON file")
    a = p.parse_args(argv)
    if not Path(a.output_dir, "eval").is_dir():
        p.error(f"{a.output_dir}/eval does not exist: pass the --output_dir of a run with eval_freq and a toy eval")
    try:
        rows = run_statistics(a.output_dir, a.dataset, a.others, a.t0)
    except ValueError as e:
        p.error(str(e))
    print(format_table(rows))
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
