"""Reward latency hiding: GRPO step time with a reward that sleeps S seconds per call vs 0 s, in one trainer run.

    OMP_NUM_THREADS=1 python bench/reward_overlap.py [--sleep 2] [--preset small] [--image-size 128] [--images 24]
                                                     [--rollout-n 4] [--rollout-mb 4] [--train-mb 12]
                                                     [--num-inference-steps 20] [--timestep-fraction 0.1]
                                                     [--pairs 2] [--warmup 1] [--threads 1] [--smoke]

The trainer calls the reward from a thread pool as soon as whole prompt groups are decoded (with a rollout
micro-batch that is a multiple of ``rollout_n``, as here: once per micro-batch), while the next micro-batches are
generated; it waits for all rewards only after the rollout. The bench counts the calls per step (M). The bench
gives the trainer one reward object (``SleepyBrightness``: sleeps ``sleep_s`` then scores mean brightness) and
switches ``sleep_s`` between 0 and ``--sleep`` from step to step (a ``TrainerCallback``), so both settings run on
the same model, weights and machine load: ``--warmup`` steps at 0 s, then ``--pairs`` x (0 s step, S s step).

By design, with M micro-batches, the reward call of micro-batch m starts when m is decoded and runs while
m+1..M are generated; the trainer waits only for what is still running when the rollout ends. With enough
reward workers (``--reward_workers`` >= calls in flight) that is the last micro-batch's call: about S seconds of the
M*S seconds of reward latency stay visible and (M-1)/M are hidden. (With calls serialised, e.g. one worker or a
service that answers one request at a time, hiding also needs rollout compute per micro-batch >= S.) The last call
cannot overlap anything: the advantages need every reward. So step(S) ~ step(0) + S, and the target
step(S) / step(0 s) <= 1.15 needs step(0) >= S / 0.15 (13.3 s for S = 2 s): the default settings give ~2.7 s of
rollout per micro-batch and a ~23 s step on one CPU thread (2-core machine, loaded).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (DEMO_PROGRAMMATIC, TINY_CONFIG, load_note, median, print_ratio, print_rerun,  # noqa: E402
                     print_table, setup_env)

TARGET = "<= 1.15"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sleep", type=float, default=2.0, help="seconds the slow reward sleeps per call")
    p.add_argument("--preset", default="small", choices=["tiny", "small"], help="tiny model preset (models/tiny.py)")
    p.add_argument("--image-size", type=int, default=128, help="square image side in pixels")
    p.add_argument("--images", type=int, default=24, help="images per step (rollout_global_batch_size, 1 rank)")
    p.add_argument("--rollout-n", type=int, default=4, help="images per prompt")
    p.add_argument("--rollout-mb", type=int, default=4, help="rollout_micro_batch_size (= images per reward call)")
    p.add_argument("--train-mb", type=int, default=12, help="atrain_micro_batch_size")
    p.add_argument("--num-inference-steps", type=int, default=20, help="denoising steps T")
    p.add_argument("--timestep-fraction", type=float, default=0.1, help="fraction of the T steps trained")
    p.add_argument("--pairs", type=int, default=2, help="measured (0 s, S s) step pairs")
    p.add_argument("--warmup", type=int, default=1, help="discarded steps first (reward at 0 s)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch intra-op threads (OMP_NUM_THREADS); 1 is stable on a shared, loaded machine")
    p.add_argument("--smoke", action="store_true", help="tiny preset, 32 px, T=2, sleep 0.2 s, one pair (seconds)")
    args = p.parse_args(argv)
    if args.smoke:
        args.sleep, args.preset, args.image_size, args.images, args.rollout_n = 0.2, "tiny", 32, 4, 2
        args.rollout_mb, args.train_mb, args.num_inference_steps, args.timestep_fraction = 2, 4, 2, 0.6
        args.pairs, args.warmup = 1, 1
    return args


def make_reward():
    import numpy as np
    import torch

    from deepgen_rl.rewards import Reward

    class SleepyBrightness(Reward):
        """Mean pixel brightness in [0, 1] after sleeping ``sleep_s`` seconds (a stand-in for a slow HTTP judge)."""

        name = "brightness"

        def __init__(self):
            self.sleep_s = 0.0
            self.calls = 0

        def score(self, images, prompts, metadata):
            self.calls += 1
            time.sleep(self.sleep_s)
            scores = [float(np.asarray(im.convert("RGB"), dtype=np.float64).mean() / 255.0) for im in images]
            return torch.tensor(scores), torch.ones(len(images), dtype=torch.bool), {}

    return SleepyBrightness()


def make_switch_callback(reward, schedule: list[float]):
    from transformers import TrainerCallback

    class SwitchSleep(TrainerCallback):
        """Step i runs with reward.sleep_s = schedule[i]; records each step's whole loop time."""

        def __init__(self):
            self.loop_s: list[float] = []
            self.calls: list[int] = []
            self.resume = None

        def on_train_begin(self, args, state, control, **kwargs):
            reward.sleep_s = schedule[0]
            self.resume = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            self.loop_s.append(time.perf_counter() - self.resume)
            self.calls.append(reward.calls - sum(self.calls))
            reward.sleep_s = schedule[min(state.global_step, len(schedule) - 1)]
            self.resume = time.perf_counter()

    return SwitchSleep()


def main(argv=None) -> int:
    args = parse_args(argv)
    setup_env(args.threads)
    from transformers.trainer_callback import PrinterCallback
    from transformers.utils import logging as hf_logging

    from deepgen_rl.models import build_model
    from deepgen_rl.trainer.grpo_trainer import DeepGenGRPOTrainer

    from step_anatomy import grpo_config

    hf_logging.set_verbosity_error()
    schedule = [0.0] * args.warmup + [0.0, args.sleep] * args.pairs
    args.steps = len(schedule) - args.warmup  # grpo_config: max_steps = warmup + steps
    args.gradient_checkpointing = False
    model = build_model(TINY_CONFIG, tiny_preset=args.preset)
    reward = make_reward()
    callback = make_switch_callback(reward, schedule)
    with tempfile.TemporaryDirectory(prefix="bench_reward_overlap_") as out_dir:
        cfg = grpo_config(args, out_dir)
        trainer = DeepGenGRPOTrainer(model, cfg, dataset_config=DEMO_PROGRAMMATIC, rewards={"brightness": reward},
                                     callbacks=[callback])
        trainer.remove_callback(PrinterCallback)
        load_before = load_note()
        history = trainer.train(resume_from_checkpoint=False)
        load_after = load_note()

    n_mb = -(-args.images // args.rollout_mb)
    M = max(callback.calls[args.warmup:])  # reward calls per step (= rollout micro-batches here)
    rows, by_sleep = [], {}
    for s in (0.0, args.sleep):
        steps = [i for i in range(args.warmup, len(schedule)) if schedule[i] == s]
        med = {k: median(history[i][f"time/{k}_s"] for i in steps) for k in ("rollout", "reward_wait", "update")}
        med["loop"] = median(callback.loop_s[i] for i in steps)
        by_sleep[s] = med
        rows.append([f"{s:g} s/call", med["loop"], med["rollout"], med["rollout"] / n_mb, med["reward_wait"],
                     med["update"], args.images / med["loop"], len(steps)])
    base, slow = by_sleep[0.0], by_sleep[args.sleep]
    total_latency = M * args.sleep
    extra = slow["loop"] - base["loop"]
    print(f"\nReward overlap: preset {args.preset!r}, {args.image_size}x{args.image_size} px, {args.images} "
          f"images/step in {n_mb} rollout micro-batches of {args.rollout_mb}, M={M} reward calls per step "
          f"(reward_workers {cfg.reward_workers}), T={args.num_inference_steps}, {args.threads} torch thread(s), "
          f"fp32 CPU")
    print(f"steps alternate 0 s / {args.sleep:g} s after {args.warmup} warm-up step(s); medians; "
          f"{load_before} (before) / {load_after} (after)")
    print_table("seconds per step (median)",
                ["reward sleep", "step s", "rollout s", "rollout/mb s", "reward wait s", "update s", "images/s", "n"],
                rows, ["", ".3f", ".3f", ".3f", ".3f", ".3f", ".2f", ""])
    per_mb = base["rollout"] / n_mb
    print(f"\nreward latency per step: M x S = {M} x {args.sleep:g} s = {total_latency:.1f} s; hideable by design: "
          f"(M-1)/M = {(M - 1) / M:.1%} ({(M - 1) * args.sleep:.1f} s) with {cfg.reward_workers} reward workers "
          f"(serialised calls would also need rollout per micro-batch >= S: here {per_mb:.2f} s vs "
          f"{args.sleep:g} s); the last micro-batch's {args.sleep:g} s cannot overlap anything")
    hidden = 1.0 - extra / total_latency if total_latency > 0 else float("nan")
    print(f"measured: step grew by {extra:.2f} s of {total_latency:.1f} s of reward latency -> hidden {hidden:.1%}; "
          f"expected step ratio ~ 1 + S/step(0) = {1 + args.sleep / base['loop']:.3f}x")
    print_ratio(f"reward_overlap (step with {args.sleep:g} s reward / step with 0 s reward)",
                slow["loop"] / base["loop"], TARGET)
    d_wait = slow["reward_wait"] - base["reward_wait"]
    print(f"time/reward_wait_s grew by {d_wait:.2f} s (by design: about {args.sleep:g} s, the last call); on a shared "
          f"machine the compute phases vary from step to step, so the wait-only ratio below isolates the latency")
    print_ratio("reward_overlap wait-only (1 + d(reward_wait) / step with 0 s reward)", 1 + d_wait / base["loop"],
                TARGET)
    print_rerun(__file__, threads=args.threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
