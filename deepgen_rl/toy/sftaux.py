"""A toy SFT-auxiliary dataset: train-split (caption, image) pairs of the toy world, for ``--sftaux_coef``.

The recipe adds λ·L_sft on real image–caption data to the GRPO loss (docs/training.md). On the toy world the
matching data is the pre-training distribution itself: train-split captions rendered the way a toy variant was
pre-trained (its layout and object sizes, `deepgen_rl.toy.pretrain.layout_kwargs`). Held-out compositions never
appear, so the term anchors what pre-training taught without showing the eval's answers.

``write_toy_sftaux(out_dir, n=…, variant=…)`` writes::

    out_dir/images/NNNNN.png    64x64 renders
    out_dir/train.jsonl         {"image": "images/NNNNN.png", "caption": …} per line
    out_dir/toy_sftaux.py       the SFT data config (pass it as --sftaux_dataset_config)

``python -m deepgen_rl.toy.sftaux --out DIR [--n 4096] [--variant slots]`` does the same from the shell.
Deterministic from ``seed``; the folder is written under a temporary name and renamed into place.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from pathlib import Path

CONFIG_NAME = "toy_sftaux.py"


def write_toy_sftaux(out_dir: str | Path, *, n: int = 4096, variant: str = "default", seed: int = 0,
                     batch_size: int = 32) -> Path:
    """Write ``n`` train-split pairs placed as ``variant`` was pre-trained; returns the config's path."""
    from tqdm.auto import tqdm

    from .model import variant_config
    from .pretrain import layout_kwargs
    from .world import IMAGE_SIZE, sample_pairs

    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    out = Path(out_dir).resolve()
    if out.exists():
        raise FileExistsError(f"{out} exists; remove it or choose another --out")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        (tmp / "images").mkdir()
        rng = random.Random(f"toy-sftaux|{variant}|{seed}")
        lay = layout_kwargs(variant_config(variant))
        lines = []
        for i in tqdm(range(n), desc="toy SFT-aux images", mininterval=2.0):
            ((cap, image),) = sample_pairs("train", 1, rng, **lay)
            rel = f"images/{i:05d}.png"
            image.save(tmp / rel)
            lines.append(json.dumps({"image": rel, "caption": cap}))
        (tmp / "train.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
        (tmp / CONFIG_NAME).write_text(
            f"# Toy SFT-auxiliary data: {n} train-split pairs of the toy world, placed as the {variant!r} variant\n"
            f"# was pre-trained (written by python -m deepgen_rl.toy.sftaux, seed {seed}).\n"
            f"image_size = {IMAGE_SIZE}\nbatch_size = {batch_size}\nnum_workers = 0\n\n"
            "datasets = [\n    dict(name=\"toy_train\", annotation=\"train.jsonl\", weight=1.0),\n]\n",
            encoding="utf-8")
        os.rename(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out / CONFIG_NAME


def main(argv=None) -> int:
    """``python -m deepgen_rl.toy.sftaux``: write a toy SFT-auxiliary dataset and print its config's path."""
    import argparse

    from .model import VARIANT_NAMES

    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("--out", required=True, help="folder to create (must not exist)")
    p.add_argument("--n", type=int, default=4096, help="number of (caption, image) pairs")
    p.add_argument("--variant", choices=VARIANT_NAMES, default="default",
                   help="the toy variant whose pre-training layout the images follow")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    print(write_toy_sftaux(a.out, n=a.n, variant=a.variant, seed=a.seed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
