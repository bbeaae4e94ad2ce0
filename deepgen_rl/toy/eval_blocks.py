"""Strict-accuracy gain between two toy evals of the same prompts and seeds, per block of duplicates.

``python -m deepgen_rl.toy.eval_blocks BEFORE AFTER [--block 8] [--dataset toy_heldout]``

BEFORE and AFTER are eval folders holding ``toy_verdicts.jsonl`` (a run's ``eval/step_N`` or ``eval_cli``'s
``OUTPUT_DIR/step_N``; the file itself also works), made with the same eval config and seed, e.g. the base model and
an RL checkpoint scored with ``tests/toy/eval_toy_heldout_x32.yaml``. An eval image's noise depends only on (seed,
dataset, prompt index, duplicate), so duplicates 0..block-1 are the images of an eval with ``block`` duplicates and
the later ones are fresh images of the same prompts.

Printed, for ``--dataset``: strict accuracy before and after and the gain in points, per block of ``--block``
duplicates (0-7, 8-15, ...), over all duplicates, and over all but the first block ("fresh": the images a
``block``-duplicate eval never showed, so a choice made by looking at that eval cannot have favoured them). The
spread of the per-block gains is the noise of a single ``block``-duplicate eval's gain.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from .evaluate import HELDOUT, VERDICTS_FILE


def read_strict(path: str | Path, dataset: str = HELDOUT) -> dict[tuple[int, int], bool]:
    """(prompt index, duplicate) -> strict verdict of ``dataset``'s images in an eval folder (or verdicts file)."""
    p = Path(path)
    if p.is_dir():
        p = p / VERDICTS_FILE
    if not p.is_file():
        raise FileNotFoundError(f"{path}: no {VERDICTS_FILE} (an eval folder: a run's eval/step_N or eval_cli's "
                                f"OUTPUT_DIR/step_N)")
    out = {}
    with open(p) as f:
        for line in f:
            r = json.loads(line)
            if r["dataset"] == dataset:
                out[(int(r["index"]), int(r["dup"]))] = bool(r["strict"])
    if not out:
        raise ValueError(f"{p}: no verdicts of dataset {dataset!r}")
    return out


def block_gains(before: dict[tuple[int, int], bool], after: dict[tuple[int, int], bool],
                block: int = 8) -> list[dict]:
    """Rows ``{"name", "dups", "images", "before", "after", "gain_points"}``: one per block of ``block`` duplicates,
    then "all" and (with more than one block) "fresh" (every duplicate from ``block`` on)."""
    if block < 1:
        raise ValueError("block must be >= 1")
    if set(before) != set(after):
        only_b, only_a = sorted(set(before) - set(after))[:3], sorted(set(after) - set(before))[:3]
        raise ValueError(f"the two evals do not have the same images (prompt index, duplicate): only before "
                         f"{only_b}, only after {only_a}; score both with the same eval config and seed")
    n_dup = max(d for _, d in before) + 1

    def row(name: str, lo: int, hi: int) -> dict:
        keys = [k for k in before if lo <= k[1] < hi]
        b = sum(before[k] for k in keys) / len(keys)
        a = sum(after[k] for k in keys) / len(keys)
        return {"name": name, "dups": (lo, hi - 1), "images": len(keys), "before": b, "after": a,
                "gain_points": 100.0 * (a - b)}

    rows = [row(f"dups {lo}-{min(lo + block, n_dup) - 1}", lo, min(lo + block, n_dup)) for lo in range(0, n_dup, block)]
    rows.append(row("all", 0, n_dup))
    if n_dup > block:
        rows.append(row("fresh", block, n_dup))
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("before")
    p.add_argument("after")
    p.add_argument("--block", type=int, default=8, help="duplicates per block (the headline eval's 8)")
    p.add_argument("--dataset", default=HELDOUT)
    a = p.parse_args(argv)
    try:
        rows = block_gains(read_strict(a.before, a.dataset), read_strict(a.after, a.dataset), a.block)
    except (OSError, ValueError) as e:
        p.error(str(e))
    print(f"{'images':<12} {'n':>5} {'before':>7} {'after':>7} {'gain (points)':>14}")
    for r in rows:
        print(f"{r['name']:<12} {r['images']:>5} {r['before']:>7.3f} {r['after']:>7.3f} {r['gain_points']:>+14.1f}")
    blocks = [r["gain_points"] for r in rows if r["name"].startswith("dups")]
    if len(blocks) > 1:
        print(f"per-block gains: mean {statistics.mean(blocks):+.1f}, standard deviation "
              f"{statistics.stdev(blocks):.1f} points (the noise of one {a.block}-duplicate eval's gain)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
