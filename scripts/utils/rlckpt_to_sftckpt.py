#!/usr/bin/env python
"""Convert an RL checkpoint's DiT into the DeepGen SFT ``.pth`` layout (keys ``transformer.<DiT key>``).

    python scripts/utils/rlckpt_to_sftckpt.py --rl_checkpoint OUTPUT_DIR/checkpoint-100 --output rl_dit.pth
    python scripts/utils/rlckpt_to_sftckpt.py --rl_checkpoint OUTPUT_DIR/checkpoint-100 --output deepgen_rl.pth \\
        --base_checkpoint $CHECKPOINT --use_ema --dtype bf16

The DiT is read with ``deepgen_rl.checkpoints.rl_format.load_dit_state_dict``: ``dit.safetensors`` (or
``ema_dit.safetensors`` with ``--use_ema``), else the DeepSpeed ZeRO shards under ``deepspeed/``, consolidated on CPU.

``--base_checkpoint`` is read by ``deepgen_rl.checkpoints.sft.read_checkpoint`` (the reader ``build_model`` uses): a
``.pth``, or the SFT training's raw DeepSpeed folder ``iter_N.pth/``, whose ZeRO shards are consolidated on CPU.
Without ``--base_checkpoint`` the output holds only the DiT. With it, the output is the full SFT checkpoint: every
non-DiT tensor (VLM LoRA, connector, projectors, meta_queries, ...) is copied from the base and every ``transformer.*``
tensor comes from the RL checkpoint; if the base has DiT tensors their key set and shapes must match the RL DiT.

``--dtype``: unset = DiT in fp32 and base tensors unchanged; ``fp32``/``bf16`` = every floating-point tensor of the
output in that dtype. The file is a plain state dict (readable by xtuner's ``guess_load_checkpoint``), written
atomically (temp file in the output folder + ``os.replace``); an existing output is only replaced with ``--force``.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # runnable from a checkout without `pip install -e`
from deepgen_rl.checkpoints.sft import read_checkpoint  # noqa: E402  (the reader build_model uses)
from deepgen_rl.checkpoints.rl_format import (  # noqa: E402
    SFT_DIT_PREFIX,
    atomic_torch_save,
    dit_source,
    load_dit_state_dict,
)

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def _cast(t: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    return t.to(dtype) if dtype is not None and t.is_floating_point() else t


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def build_sft_state_dict(dit: dict[str, torch.Tensor], base: dict[str, torch.Tensor] | None = None,
                         dtype: torch.dtype | None = None) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """``(state_dict, origin)``: the DiT under ``transformer.`` (fp32 unless ``dtype``) merged over ``base``'s
    non-DiT tensors; ``origin[key]`` is ``"rl"`` or ``"base"``. Raises if the base's DiT keys/shapes disagree."""
    out: dict[str, torch.Tensor] = {}
    origin: dict[str, str] = {}
    if base is not None:
        base_dit = {k[len(SFT_DIT_PREFIX):]: v for k, v in base.items() if k.startswith(SFT_DIT_PREFIX)}
        if base_dit:
            missing, unexpected = sorted(set(base_dit) - set(dit)), sorted(set(dit) - set(base_dit))
            bad_shapes = [k for k in set(dit) & set(base_dit) if dit[k].shape != base_dit[k].shape]
            if missing or unexpected or bad_shapes:
                raise ValueError(
                    "RL DiT does not match the base checkpoint's DiT: "
                    f"{len(missing)} keys only in base {missing[:5]}, {len(unexpected)} only in RL {unexpected[:5]}, "
                    f"{len(bad_shapes)} shape mismatches {sorted(bad_shapes)[:5]}")
        for key, value in base.items():
            if not key.startswith(SFT_DIT_PREFIX):
                out[key] = _cast(value, dtype)
                origin[key] = "base"
    for key, value in dit.items():
        full = SFT_DIT_PREFIX + key
        out[full] = value.detach().to(dtype or torch.float32).contiguous() if value.is_floating_point() else value
        origin[full] = "rl"
    return out, origin


def summarize(state_dict: dict[str, torch.Tensor], origin: dict[str, str]) -> list[str]:
    """One line per top-level part (``transformer``, ``lmm``, ``connector``, ...): tensors, bytes, source."""
    parts: dict[str, list[str]] = {}
    for key in state_dict:
        parts.setdefault(key.split(".", 1)[0], []).append(key)
    lines = []
    for part, keys in sorted(parts.items()):
        dtypes = Counter(str(state_dict[k].dtype).replace("torch.", "") for k in keys)
        sources = sorted({origin[k] for k in keys})
        lines.append(f"  {part:<16} {len(keys):>6} tensors {_nbytes(state_dict[k] for k in keys):>14,} bytes  "
                     f"from {'+'.join(sources)}  ({', '.join(f'{d}: {n}' for d, n in sorted(dtypes.items()))})")
    return lines


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Convert an RL checkpoint's DiT into the DeepGen SFT .pth layout.")
    parser.add_argument("--rl_checkpoint", required=True, help="OUTPUT_DIR/checkpoint-N (format deepgen_rl.checkpoint.v1)")
    parser.add_argument("--output", required=True, help="output .pth path")
    parser.add_argument("--base_checkpoint", default=None,
                        help="DeepGen SFT .pth (or the SFT training's DeepSpeed iter_N.pth/ folder, consolidated on "
                             "CPU) to merge into (keeps its VLM LoRA, connector, projectors, meta_queries)")
    parser.add_argument("--use_ema", action="store_true", help="take the DiT from ema_dit.safetensors")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default=None,
                        help="cast every floating tensor of the output (default: DiT fp32, base tensors unchanged)")
    parser.add_argument("--force", action="store_true", help="overwrite an existing --output")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    output = Path(args.output)
    if output.exists() and not args.force:
        print(f"error: {output} exists; pass --force to overwrite it", file=sys.stderr)
        return 1
    dtype = DTYPES[args.dtype] if args.dtype else None
    dit = load_dit_state_dict(args.rl_checkpoint, use_ema=args.use_ema)
    base = read_checkpoint(args.base_checkpoint) if args.base_checkpoint else None
    state_dict, origin = build_sft_state_dict(dit, base, dtype)
    atomic_torch_save(state_dict, output)

    print(f"wrote {output}: {len(state_dict)} tensors, {_nbytes(state_dict.values()):,} bytes of tensor data "
          f"({output.stat().st_size:,} bytes on disk)")
    print(f"  rl  : {sum(1 for o in origin.values() if o == 'rl')} DiT tensors from "
          f"{dit_source(args.rl_checkpoint, args.use_ema)}")
    if base is not None:
        replaced = sum(1 for k in base if k.startswith(SFT_DIT_PREFIX))
        print(f"  base: {sum(1 for o in origin.values() if o == 'base')} tensors from {args.base_checkpoint} "
              f"({replaced} base DiT tensors replaced by the RL DiT)")
    print("\n".join(summarize(state_dict, origin)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
