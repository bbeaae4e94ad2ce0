"""Standalone toy-world evaluation of a model (+ optional RL checkpoint), the same code path as ``eval_freq``.

``python -m deepgen_rl.toy.eval_cli --output_dir outputs/toy_eval [--checkpoint outputs/run/checkpoint-40
[--use_ema]] [--model_dir DIR]`` writes ``<output_dir>/step_<step>/toy.html`` (every image with its checker verdict),
``toy_summary.json`` and ``toy_verdicts.jsonl``, and prints strict accuracy and per-claim-type accuracy per dataset.
"""

from __future__ import annotations

import argparse
import json


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--output_dir", required=True)
    p.add_argument("--model_config", default="configs/models/deepgen_toy.py")
    p.add_argument("--checkpoint", default=None, help="RL checkpoint directory (or .pth / .safetensors) to load")
    p.add_argument("--use_ema", action="store_true",
                   help="take the DiT from the RL checkpoint's ema_dit.safetensors (what eval_freq evaluates when "
                        "training ran with --ema_decay > 0) instead of its dit.safetensors")
    p.add_argument("--model_dir", default=None,
                   help="a toy model folder built with python -m deepgen_rl.toy.model --variant NAME --out DIR "
                        "(default: the toy config's own cache)")
    p.add_argument("--eval_dataset_config", default="assets/rl_datasets/toy/eval/eval_toy.yaml")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--step", type=int, default=0, help="label of the output folder step_<step>")
    p.add_argument("--image_size", type=int, default=64)
    p.add_argument("--cpu_fast_gelu", action="store_true",
                   help="the DiT's tanh GELUs as x*sigmoid(2u) on the CPU, as training with --cpu_fast_gelu true "
                        "evaluates (the same function to float rounding)")
    a = p.parse_args(argv)

    from deepgen_rl.evaluation.config import load_eval_config
    from deepgen_rl.evaluation.runner import run_unigenbench_eval
    from deepgen_rl.models import build_model

    overrides = {}
    if a.model_dir:
        from .model import model_dir_overrides

        try:
            overrides = model_dir_overrides(a.model_dir)
        except (OSError, ValueError) as e:
            p.error(str(e))
    if a.use_ema and not a.checkpoint:
        p.error("--use_ema needs --checkpoint (an RL checkpoint directory with ema_dit.safetensors)")
    model = build_model(a.model_config, checkpoint=None if a.use_ema else a.checkpoint, **overrides)
    if a.use_ema:
        try:
            load_ema_dit(model, a.checkpoint)
        except (OSError, ValueError) as e:
            p.error(str(e))
    model.cpu_fast_gelu = a.cpu_fast_gelu
    metrics = run_unigenbench_eval(model, load_eval_config(a.eval_dataset_config), a.output_dir, a.step,
                                   height=a.image_size, width=a.image_size, seed=a.seed, judge=False,
                                   batch_size=32)
    print(json.dumps({k: round(v, 4) for k, v in sorted(metrics.items())}, indent=1))
    return 0


def load_ema_dit(model, checkpoint_dir: str) -> None:
    """Put the EMA weights of RL checkpoint ``checkpoint_dir`` into ``model.transformer``: every parameter must be
    there with its shape (buffers such as the positional table are not part of the EMA and stay as built)."""
    from deepgen_rl.checkpoints.rl_format import load_dit_state_dict
    from deepgen_rl.checkpoints.sft import shape_mismatches

    state = load_dit_state_dict(checkpoint_dir, use_ema=True)
    dit = model.transformer
    params = dict(dit.named_parameters())
    missing = sorted(set(params) - set(state))
    unexpected = sorted(set(state) - set(dit.state_dict()))
    if missing or unexpected:
        raise ValueError(f"{checkpoint_dir}: the EMA does not match the DiT: missing {missing[:5]}, unexpected "
                         f"{unexpected[:5]}")
    bad = shape_mismatches(state, params)
    if bad:
        raise ValueError(f"{checkpoint_dir}: EMA shape mismatch: {bad[:5]}")
    dit.load_state_dict(state, strict=False)


if __name__ == "__main__":
    raise SystemExit(main())
