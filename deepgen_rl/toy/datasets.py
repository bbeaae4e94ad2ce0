"""The toy world's prompt files under ``assets/rl_datasets/toy/`` (regenerate: ``python -m deepgen_rl.toy.datasets``).

  eval/heldout.jsonl   ``EVAL_HELDOUT`` held-out-split captions (fixed seed): the RL proof's and quickstart's eval set
  eval/train.jsonl     ``EVAL_TRAIN`` train-split captions: how well pre-training itself went
  rl_prompts.jsonl     every other held-out-split caption: the RL training prompts (disjoint from eval/heldout)
  rl_train_count_region.jsonl  every train-split count and region caption: the second dataset of ``toy_rl_mix.yaml``
                       (the headline run's mixture; the held-out split's count and region captions are all in the eval)

Every record is ``{"prompt": caption, "spec": Spec.to_dict()}``; the reward re-parses the caption (the spec is there
for readers). Held-out captions contain a colour–shape pair that pre-training never showed; RL sees some of those
pairs in other captions, never the eval captions themselves.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .world import Spec, caption, sample_specs, split_specs

EVAL_HELDOUT = 64
EVAL_TRAIN = 64
SEED = 0
ROOT = Path(__file__).resolve().parents[2] / "assets" / "rl_datasets" / "toy"


def eval_heldout_specs() -> list[Spec]:
    return sample_specs("held_out", EVAL_HELDOUT, seed=SEED)


def eval_train_specs() -> list[Spec]:
    return sample_specs("train", EVAL_TRAIN, seed=SEED + 1)


def rl_specs() -> list[Spec]:
    held = set(eval_heldout_specs())
    return [s for s in split_specs("held_out") if s not in held]


def rl_train_count_region_specs() -> list[Spec]:
    return [s for s in split_specs("train") if s.kind in ("count", "region")]


def records(specs: list[Spec]) -> str:
    return "".join(json.dumps({"prompt": caption(s), "spec": s.to_dict()}) + "\n" for s in specs)


def files() -> dict[str, str]:
    """Relative path -> content of every generated prompt file."""
    return {"eval/heldout.jsonl": records(eval_heldout_specs()), "eval/train.jsonl": records(eval_train_specs()),
            "rl_prompts.jsonl": records(rl_specs()),
            "rl_train_count_region.jsonl": records(rl_train_count_region_specs())}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=str(ROOT))
    a = p.parse_args(argv)
    for rel, text in files().items():
        path = Path(a.out) / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        print(path, text.count("\n"), "prompts")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
