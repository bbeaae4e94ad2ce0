"""Rollout time with the shared ODE prefix (``--share_ode_prefix``) against one forward per image, side by side.

    OMP_NUM_THREADS=1 python bench/shared_ode_prefix.py [--model toy|tiny] [--T 8] [--window 2] [--groups 8]
                                                        [--rollout-n 8] [--micro-batch 64] [--repeats 3] [--smoke]

With ``--init_same_noise`` and an SDE window (Flow-GRPO-Fast), the steps before the window are ODE steps from a
group's shared x_T: ``share_ode_prefix`` runs them once per group. For each window start s (every start the
trainer draws, 0 .. T - 1 - window), the real ``deepgen_rl.rollout.rollout`` generates ``groups x rollout_n`` images
with sharing on and off, alternating (``--repeats`` rounds, median per arm). Printed per start: the DiT rows
counted by a wrapper of ``predict_velocity`` (closed form: per micro-batch, s x groups-in-it + (T - s) x its images),
seconds per rollout of each arm, their ratio, and max |latent difference| between the arms (rounding only). The
ratios are the mean over starts (each start is equally likely): rows shared / per image (exact) and time shared /
per image (measured).
The time saved is less than the rows saved by the VAE decode and the per-step updates, which sharing does not touch.

``--model toy`` uses the cached ``slots`` toy DeepGen (``python -m deepgen_rl.toy.model --variant slots`` builds it;
the toy RL runs' model, 64 px); ``--model tiny`` the tiny random model's "small" preset (no build).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (TINY_PROMPTS, RolloutItem, add_rollout_args, apply_rollout_smoke,  # noqa: E402
                     load_note, load_rollout_model, median, print_ratio, print_rerun, print_table, setup_env,
                     timed_window_rollout)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_rollout_args(p, groups=8, repeats=3)
    p.add_argument("--window", type=int, default=2, help="SDE window size (the toy runs: 2)")
    args = p.parse_args(argv)
    apply_rollout_smoke(args)
    if not 1 <= args.window <= args.T - 1:
        p.error(f"--window must be in 1..T-1 (the last step is never stochastic; T = {args.T}), got {args.window}")
    return args


def load_model(args):
    model = load_rollout_model(args.model, args.smoke, "slots")
    return model, TINY_PROMPTS if args.model == "tiny" else \
        ["a red circle left of a blue square", "a green triangle above a yellow circle"]


def main(argv=None) -> int:
    args = parse_args(argv)
    setup_env(args.threads)
    from deepgen_rl.rl.samplers import make_sigmas

    model, texts = load_model(args)
    items = [RolloutItem(texts[g % len(texts)], "bench", g, g) for g in range(args.groups)]
    sigmas = make_sigmas(args.T, model.scheduler_shift)

    def run(start: int, share: bool):
        dt, rows, batch = timed_window_rollout(model, items, args, sigmas, start, args.window, share_ode_prefix=share)
        return dt, rows, batch.latents

    n = args.groups * args.rollout_n
    run(0, True)  # warm-up (allocator, first-call overheads)
    table, row_ratios, time_ratios = [], [], []
    for start in range(args.T - args.window):  # the trainer's starts: 0 .. T - 1 - window
        times = {True: [], False: []}
        rows, lat = {}, {}
        for _ in range(args.repeats):
            for share in (True, False):
                dt, r, latents = run(start, share)
                times[share].append(dt)
                rows[share], lat[share] = r, latents
        expect = 0
        for s in range(0, n, args.micro_batch):
            idx = range(s, min(s + args.micro_batch, n))
            expect += start * len({i // args.rollout_n for i in idx}) + (args.T - start) * len(idx)
        assert rows[True] == expect and rows[False] == args.T * n, (rows, expect)
        t_share, t_plain = median(times[True]), median(times[False])
        row_ratios.append(rows[True] / rows[False])
        time_ratios.append(t_share / t_plain)
        table.append([start, rows[True], rows[False], row_ratios[-1], t_share, t_plain, time_ratios[-1],
                      float((lat[True] - lat[False]).abs().max())])
    print(f"\nShared ODE prefix: model {args.model!r}, {args.groups} prompts x {args.rollout_n} images, "
          f"{args.size} px, T = {args.T}, SDE window {args.window} at each start, micro-batch {args.micro_batch}, "
          f"{args.repeats} alternating rounds (median), {args.threads} thread(s); {load_note()}")
    print_table("per window start", ["window start", "DiT rows shared", "DiT rows per image", "rows ratio",
                                     "s shared", "s per image", "time ratio", "max |dlatent|"], table,
                ["", "", "", ".3f", ".3f", ".3f", ".3f", ".1e"])
    print_ratio("DiT rows shared / per image (mean over window starts)", sum(row_ratios) / len(row_ratios))
    print_ratio("rollout time shared / per image (mean over window starts)", sum(time_ratios) / len(time_ratios),
                "<= 1.0")
    print_rerun(__file__, threads=args.threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
