"""Rollouts with ``--reuse_last_velocity`` against the full ODE tail, side by side: time, DiT rows, and what the
reward sees.

    OMP_NUM_THREADS=1 python bench/reuse_last_velocity.py [--model toy|tiny] [--T 8] [--groups 8] [--rollout-n 8]
                                                          [--micro-batch 64] [--repeats 2] [--smoke]

diffusers' shifted schedule ends with a step from a tiny σ_{T-1} to 0 (0.009 at 8 steps, shift 3). With
``reuse_last_velocity`` a rollout takes that step, when it is an ODE step, with step T-2's velocity instead of one
more DiT forward. For each start s of a one-step SDE window that leaves the last step ODE (0 .. T-2), the real
``deepgen_rl.rollout.rollout`` generates ``groups x rollout_n`` images (shared x_T per group, cps_sde, η 0.7) with
the option on and off, alternating (``--repeats`` rounds, median per arm), from the same noise. Printed per start:
the DiT rows counted by a wrapper of ``predict_velocity`` (closed form: one step's rows fewer), seconds per rollout of
each arm and their ratio, max |x_0 difference|. With ``--model toy`` (the headline's cached ``slots_wide`` toy
DeepGen, 64 px) also the ``toy_compositional`` reward (exclusive, soft colour: the headline's) of both arms' images:
mean reward, and the correlation of the advantages the trainer computes from it (``compute_advantages``, gdpo; images
whose advantage is 0 in both arms, i.e. groups with all rewards equal, left out), which is what GRPO's gradient is made
of. ``--model tiny`` (the random tiny model, no reward) times only.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (TINY_PROMPTS, RolloutItem, add_rollout_args, apply_rollout_smoke,  # noqa: E402
                     load_note, load_rollout_model, median, print_ratio, print_rerun, print_table, setup_env,
                     timed_window_rollout)

TOY_PROMPTS = "assets/rl_datasets/toy/rl_prompts.jsonl"  # the held-out relations the headline's RL mostly draws


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_rollout_args(p, groups=32, repeats=2)
    args = p.parse_args(argv)
    apply_rollout_smoke(args)
    if args.T < 2:
        p.error(f"--T must be >= 2 (a last step to reuse a velocity for), got {args.T}")
    return args


def load_model(args):
    model = load_rollout_model(args.model, args.smoke, "slots_wide")
    if args.model == "tiny":
        return model, TINY_PROMPTS
    import json

    with open(Path(__file__).resolve().parents[1] / TOY_PROMPTS) as f:
        prompts = [json.loads(line)["prompt"] for line in f if line.strip()]
    return model, prompts[::max(1, len(prompts) // args.groups)]


def correlation(a, b) -> float:
    """Pearson correlation of advantages a and b over the images where either is non-zero (nan if < 2)."""
    import torch

    keep = (a != 0) | (b != 0)
    return float(torch.corrcoef(torch.stack([a[keep], b[keep]]))[0, 1]) if keep.sum() > 1 else float("nan")


def main(argv=None) -> int:
    args = parse_args(argv)
    setup_env(args.threads)
    import torch

    from deepgen_rl.rl.advantages import compute_advantages
    from deepgen_rl.rl.samplers import make_sigmas

    model, texts = load_model(args)
    reward = None
    if args.model == "toy":
        from deepgen_rl.rewards.toy_compositional import ToyCompositionalReward

        reward = ToyCompositionalReward(exclusive=True, soft_color=True)
    items = [RolloutItem(texts[g % len(texts)], "bench", g, g) for g in range(args.groups)]
    sigmas = make_sigmas(args.T, model.scheduler_shift)

    def run(start: int, reuse: bool):
        return timed_window_rollout(model, items, args, sigmas, start, 1, reuse_last_velocity=reuse)

    def advantages(scores, batch):  # what the trainer computes from one reward (gdpo, weight 1)
        return compute_advantages("gdpo", scores, torch.ones(1), batch.group_ids).advantages

    n = args.groups * args.rollout_n
    run(0, True)  # warm-up (allocator, first-call overheads)
    table, row_ratios, time_ratios = [], [], []
    adv = {True: [], False: []}
    for start in range(args.T - 1):  # one-step windows that leave the last step ODE
        times = {True: [], False: []}
        rows, out = {}, {}
        for _ in range(args.repeats):
            for reuse in (True, False):
                dt, r, batch = run(start, reuse)
                times[reuse].append(dt)
                rows[reuse], out[reuse] = r, batch
        assert rows[False] - rows[True] == n, rows  # the last step's rows: one per image
        assert torch.equal(out[True].latents[:, :args.T], out[False].latents[:, :args.T])
        t_reuse, t_full = median(times[True]), median(times[False])
        row_ratios.append(rows[True] / rows[False])
        time_ratios.append(t_reuse / t_full)
        line = [start, rows[True], rows[False], t_reuse, t_full, time_ratios[-1],
                float((out[True].latents[:, -1] - out[False].latents[:, -1]).abs().max())]
        if reward is not None:
            scores = {k: reward.score(b.images, b.prompts, b.metadata)[0] for k, b in out.items()}
            for k in (True, False):
                adv[k].append(advantages(scores[k], out[k]))
            line += [float(scores[True].mean()), float(scores[False].mean()),
                     correlation(adv[True][-1], adv[False][-1])]
        table.append(line)
    print(f"\nReused last velocity: model {args.model!r}, {args.groups} prompts x {args.rollout_n} images, {args.size} "
          f"px, T = {args.T}, one-step SDE window at each start, micro-batch {args.micro_batch}, {args.repeats} "
          f"alternating rounds (median), {args.threads} thread(s); {load_note()}")
    header = ["window start", "DiT rows reuse", "DiT rows full", "s reuse", "s full", "time ratio", "max |dx_0|"]
    formats = ["", "", "", ".3f", ".3f", ".3f", ".1e"]
    if reward is not None:
        header += ["reward reuse", "reward full", "advantage corr"]
        formats += [".4f", ".4f", ".3f"]
    print_table("per window start", header, table, formats)
    print_ratio("DiT rows reuse / full (mean over window starts)", sum(row_ratios) / len(row_ratios))
    print_ratio("rollout time reuse / full (mean over window starts)", sum(time_ratios) / len(time_ratios), "<= 1.0")
    if reward is not None:
        a, b = torch.cat(adv[True]), torch.cat(adv[False])
        print(f"group advantages, reuse vs full: correlation {correlation(a, b):.4f} over "
              f"{int(((a != 0) | (b != 0)).sum())} images (groups with all rewards equal in both arms left out)")
    print_rerun(__file__, threads=args.threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
