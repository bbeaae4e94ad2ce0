"""The toy checker's first step and the whole ``toy_compositional`` reward: NumPy's last-axis max/min (the checker
before 2026-12-06) against the plane-by-plane max/min it uses now, side by side.

    OMP_NUM_THREADS=1 python bench/toy_reward.py [--images 512] [--repeats 5] [--smoke]

Images: train-split captions of the toy world (``deepgen_rl.toy.world.sample_pairs``, random layouts), half of them
as rendered and half with Gaussian pixel noise (σ 12, clipped) so that, like a model's samples, they are not flat
colours. Step 1 (``checker._hue_and_vivid``: per pixel, whether it is vivid and its hue) is timed for the reference,
which takes the channels' max and min with ``max(-1)``/``min(-1)`` of the float32 image, and for the checker's own;
both arms must return the same arrays bit for bit (asserted). Then the whole reward as the headline runs it
(``ToyCompositionalReward(exclusive=True, soft_color=True).score``) is timed with the checker's step 1 and with the
reference swapped in, and must give the same scores. Arms alternate, ``--repeats`` rounds, median per arm.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import load_note, median, print_ratio, print_rerun, print_table, setup_env  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--images", type=int, default=512, help="images scored per round (the headline eval's 512)")
    p.add_argument("--repeats", type=int, default=5, help="alternating rounds per arm")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (OMP_NUM_THREADS)")
    p.add_argument("--smoke", action="store_true", help="32 images, 2 rounds (seconds)")
    args = p.parse_args(argv)
    if args.smoke:
        args.images, args.repeats = 32, 2
    if args.images < 2:
        p.error(f"--images must be >= 2, got {args.images}")
    return args


def reference_hue_and_vivid(image):
    """Step 1 as the checker computed it before 2026-12-06: max/min over the last axis of the float32 image."""
    import numpy as np

    from deepgen_rl.toy.checker import MIN_CHROMA, MIN_SATURATION

    x = image.astype(np.float32)
    mx = x.max(-1)
    chroma = mx - x.min(-1)
    sat = chroma / np.maximum(mx, 1.0)
    vivid = (chroma >= MIN_CHROMA) & (sat >= MIN_SATURATION)
    hue = np.zeros(mx.shape, dtype=np.float32)
    px, m, c = x[vivid], mx[vivid], chroma[vivid]
    r, g, b = px[:, 0], px[:, 1], px[:, 2]
    hue[vivid] = np.where(m == r, ((g - b) / c) % 6, np.where(m == g, (b - r) / c + 2, (r - g) / c + 4)) * 60
    return hue, vivid


def make_images(n: int):
    import random

    import numpy as np
    from PIL import Image

    from deepgen_rl.toy.world import sample_pairs

    pairs = sample_pairs("train", n, random.Random(0))
    rng = np.random.default_rng(0)
    prompts, images = [], []
    for i, (text, im) in enumerate(pairs):
        if i % 2:
            a = np.asarray(im, dtype=np.float32) + rng.normal(0.0, 12.0, (im.size[1], im.size[0], 3))
            im = Image.fromarray(np.clip(a, 0, 255).round().astype(np.uint8))
        prompts.append(text)
        images.append(im)
    return prompts, images


def main(argv=None) -> int:
    args = parse_args(argv)
    setup_env(args.threads)
    import numpy as np

    from deepgen_rl.rewards.toy_compositional import ToyCompositionalReward
    from deepgen_rl.toy import checker

    prompts, images = make_images(args.images)
    arrays = [checker._as_array(im) for im in images]
    ours = checker._hue_and_vivid
    for a in arrays:  # the same numbers, bit for bit, before anything is timed
        (h0, v0), (h1, v1) = reference_hue_and_vivid(a), ours(a)
        assert np.array_equal(v0, v1) and np.array_equal(h0, h1)
    reward = ToyCompositionalReward(exclusive=True, soft_color=True)
    metadata = [{}] * len(images)

    def step1(fn):
        t = time.perf_counter()
        for a in arrays:
            fn(a)
        return time.perf_counter() - t

    def whole(fn):
        checker._hue_and_vivid = fn
        try:
            t = time.perf_counter()
            scores = reward.score(images, prompts, metadata)[0]
            return time.perf_counter() - t, scores
        finally:
            checker._hue_and_vivid = ours

    step1(ours)  # warm-up (imports, caches)
    whole(ours)
    t_step = {"reference": [], "checker": []}
    t_whole = {"reference": [], "checker": []}
    scores = {}
    for _ in range(args.repeats):
        for name, fn in (("reference", reference_hue_and_vivid), ("checker", ours)):
            t_step[name].append(step1(fn))
            dt, scores[name] = whole(fn)
            t_whole[name].append(dt)
    assert bool((scores["reference"] == scores["checker"]).all()), "the two arms scored differently"
    ms = 1000.0 / len(images)
    rows = [[name, median(t_step[name]) * ms, median(t_whole[name]) * ms] for name in ("reference", "checker")]
    print(f"\nToy reward: {len(images)} images (train-split captions, half with pixel noise), {args.repeats} "
          f"alternating rounds (median), {args.threads} thread(s); score sum {float(scores['checker'].sum()):.6f} in "
          f"both arms; {load_note()}")
    print_table("milliseconds per image", ["step 1", "hue and vivid", "whole toy_compositional reward"], rows,
                ["", ".3f", ".3f"])
    print_ratio("hue and vivid: checker / reference", median(t_step["checker"]) / median(t_step["reference"]),
                "<= 1.0")
    print_ratio("toy_compositional reward: checker / reference",
                median(t_whole["checker"]) / median(t_whole["reference"]), "<= 1.0")
    print_rerun(__file__, threads=args.threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
