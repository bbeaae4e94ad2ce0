"""Bytes per image of stored rollout trajectories, measured from the tensors ``rollout()`` returns.

    OMP_NUM_THREADS=1 python bench/rollout_memory.py [--preset small] [--configs 64:4,128:8,256:6] [--images 8]
                                                     [--micro-batch 4] [--threads 1] [--smoke]

For each ``size:T`` the real ``deepgen_rl.rollout.rollout`` generates ``--images`` images; the bench reads the
allocated storage of ``RolloutBatch.latents`` and ``RolloutBatch.log_probs`` (``untyped_storage().nbytes()``, so a
view into a larger buffer or a wider dtype would show) and divides by the number of images. The bound is the
trajectory the policy update needs, (T+1) fp32 latents of C x h x w per image: (T+1)*C*h*w*4 bytes.
Ratios: latents / bound (target <= 1.0) and (latents + log_probs) / bound (log_probs add T*4 bytes per image).
The decoded PIL images (uint8 RGB, kept for the reward and sample grids) are listed but are not part of the bound.
The last lines extrapolate the same formula to the real recipe (512x512, T=50) from the measured bytes per element.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (TINY_CONFIG, RolloutItem, load_note, print_ratio, print_rerun, print_table,  # noqa: E402
                     setup_env)

TARGET = "<= 1.0"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="small", choices=["tiny", "small"], help="tiny model preset (models/tiny.py)")
    p.add_argument("--configs", default="64:4,128:8,256:6", help="comma-separated image_size:T pairs")
    p.add_argument("--images", type=int, default=8, help="images per rollout")
    p.add_argument("--rollout-n", type=int, default=4, help="images per prompt")
    p.add_argument("--micro-batch", type=int, default=4, help="rollout micro-batch size")
    p.add_argument("--real-steps", type=int, default=50, help="T of the extrapolated real-size row")
    p.add_argument("--real-size", type=int, default=512, help="image side of the extrapolated real-size row")
    p.add_argument("--real-images", type=int, default=32, help="images per rank of the extrapolated row")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (OMP_NUM_THREADS)")
    p.add_argument("--smoke", action="store_true", help="tiny preset, 32 px, T=2 and T=3 (seconds)")
    args = p.parse_args(argv)
    if args.smoke:
        args.preset, args.configs, args.images, args.rollout_n, args.micro_batch = "tiny", "32:2,32:3", 4, 2, 2
    args.configs = [tuple(int(v) for v in c.split(":")) for c in args.configs.split(",") if c.strip()]
    return args


def storage_bytes(t) -> int:
    return t.untyped_storage().nbytes()


def main(argv=None) -> int:
    args = parse_args(argv)
    setup_env(args.threads)
    import torch

    from deepgen_rl.models import build_model
    from deepgen_rl.rl.samplers import DEFAULT_SDE_SAMPLER, make_sigmas
    from deepgen_rl.rollout import rollout

    model = build_model(TINY_CONFIG, tiny_preset=args.preset)
    items = [RolloutItem(f"a red apple on a table, number {g}", "bench", g, g)
             for g in range(args.images // args.rollout_n)]
    rows, ratios = [], []
    for size, T in args.configs:
        batch = rollout(model, items, rollout_n=args.rollout_n, micro_batch_size=args.micro_batch,
                        sigmas=make_sigmas(T, model.scheduler_shift), stochastic=torch.ones(T, dtype=torch.bool),
                        sampler=DEFAULT_SDE_SAMPLER, eta=0.7, height=size, width=size, seed=0, step=0, rank=0)
        n = len(batch)
        c, h, w = model.latent_shape(size, size)
        bound = (T + 1) * c * h * w * 4
        lat = storage_bytes(batch.latents) / n
        lp = storage_bytes(batch.log_probs) / n
        pil = sum(len(im.tobytes()) for im in batch.images) / n
        assert batch.latents.shape == (n, T + 1, c, h, w), batch.latents.shape
        ratios.append((lat / bound, (lat + lp) / bound))
        rows.append([f"{size}x{size}", T, f"{c}x{h}x{w}", str(batch.latents.dtype).replace("torch.", ""), int(lat),
                     int(lp), int(bound), lat / bound, (lat + lp) / bound, int(pil)])

    # Same layout at the real recipe's size, from the measured bytes per stored element of the last row.
    size, T = args.configs[-1]
    c, h, w = model.latent_shape(size, size)
    per_elem = float(rows[-1][4]) / ((T + 1) * c * h * w)
    rh, rw = args.real_size // 8, args.real_size // 8
    real_lat = per_elem * (args.real_steps + 1) * 16 * rh * rw
    real_lp = 4.0 * args.real_steps
    real_bound = (args.real_steps + 1) * 16 * rh * rw * 4
    rows.append([f"{args.real_size}x{args.real_size} (extrapolated)", args.real_steps, f"16x{rh}x{rw}", "float32",
                 int(real_lat), int(real_lp), int(real_bound), real_lat / real_bound, (real_lat + real_lp) / real_bound,
                 args.real_size * args.real_size * 3])

    print(f"\nRollout trajectory memory: preset {args.preset!r}, {args.images} images per rollout "
          f"({args.images // args.rollout_n} prompts x {args.rollout_n}), micro-batch {args.micro_batch}, "
          f"sampler {DEFAULT_SDE_SAMPLER}, storage on CPU; bound = (T+1) x C x h x w x 4 bytes (fp32 latents); "
          f"{load_note()}")
    print_table("bytes per image", ["image", "T", "latent", "dtype", "latents B", "log_probs B", "bound B",
                                    "latents/bound", "total/bound", "PIL image B"], rows,
                ["", "", "", "", "", "", "", ".4f", ".4f", ""])
    mb = real_lat * args.real_images / 2**20
    print(f"\nreal recipe: {args.real_images} images/rank x {real_lat / 2**20:.2f} MiB = {mb:.0f} MiB of trajectory "
          f"per rank per step (on --trajectory_device)")
    print_ratio("latents / bound (worst measured config)", max(r[0] for r in ratios), TARGET)
    print_ratio("(latents + log_probs) / bound (worst measured config)", max(r[1] for r in ratios))
    print_rerun(__file__, threads=args.threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
