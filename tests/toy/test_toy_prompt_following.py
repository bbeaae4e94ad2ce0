"""The toy world's headline claim, end to end through ``bash scripts/toy_prompt_following.sh`` with its defaults:
MR-GRPO (cps_sde, gdpo; two gloo ranks, a one-step SDE window starting at step 1-5, ``soft_color``, the SFT anchor, an
EMA of the DiT, RL prompts mixing held-out relations with train-split count and region captions, ``--cpu_fast_gelu``)
on the ``slots_wide`` toy model raises held-out strict accuracy by at least 15 points at its last eval, step 60 (the
issue's target: 60 steps were chosen to fit 15 minutes on the slowest 2-core machine met), and the rise is prompt
following.

Opt-in (DEEPGEN_TOY_SLOW_TESTS=1; ~9-15 minutes on an idle 2-core machine plus the `slots_wide` build, ~8-13 minutes,
cached): too long for CI, whose toy RL test is tests/toy/test_toy_rl.py. Seed 0, the script's defaults (60 steps,
evals every 20). Pinned numerics make a two-rank run repeat to the last digit on one machine; across machines runs
differ (numpy's SIMD loops, pinned since 2026-12-06, were one cause). **This test fails on seed 0's run on the AVX2-only
machine of 2026-12-06** (docs/toy_world.md, "Windows from steps 1-5; 60 steps"): 0.342 -> 0.484 at step 60, +14.2,
14.6 minutes from launch. That is the issue's target not being met there, and the test keeps asserting it.

Asserted at step 60 (64 held-out prompts x 8 images, ODE, fixed seeds), each one-sided exact sign test over the
prompts whose outcome changed (`deepgen_rl.toy.rl_run.paired_sign_test`) at false-positive rate <= alpha = 0.01:
  * strict accuracy >= step 0 + 0.15 (the issue's target, a magnitude; measured 0.342 -> 0.484, which fails) and per
    prompt up more than down (p < alpha; measured 39 up / 8 down, p = 2.8e-6);
  * own - other (a prompt's claim score minus the same images' score on 8 other prompts' claims) up per prompt
    (p < alpha; measured 0.430 -> 0.560, 58 up / 6 down, p = 4.5e-12): a prompt-blind change (brighter, greener,
    more objects) lifts both terms alike;
  * the other-prompt score moves by less than 0.02 (it does not learn to satisfy any caption; measured 0.219 ->
    0.224).
The wall time is printed, not asserted (machines differ).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ALPHA = 0.01
STEPS = 60
EVALS = [0, 20, 40, 60]

pytestmark = pytest.mark.skipif(
    os.environ.get("DEEPGEN_TOY_SLOW_TESTS") != "1",
    reason="opt-in (~9-15 minutes on 2 idle cores, plus the slots_wide build): set DEEPGEN_TOY_SLOW_TESTS=1")


@pytest.mark.slow
def test_headline_run_raises_heldout_strict_accuracy_by_15_points_and_follows_prompts(tmp_path):
    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k not in ("TOY_STEPS", "TOY_EVAL_EVERY", "TOY_VARIANT", "NGPUS")}
    env.update(TOY_SEED="0", TOY_OUTPUT_DIR=str(out))  # the script's defaults, as a user runs it
    t0 = time.time()
    proc = subprocess.run(["bash", "scripts/toy_prompt_following.sh"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=3600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    print(proc.stdout[-2500:])
    print(f"wall: {(time.time() - t0) / 60:.1f} minutes (build and SFT pairs included when not cached)")
    rows = {r["step"]: r for r in json.loads((out / "report.json").read_text())}
    assert sorted(rows) == EVALS, sorted(rows)
    first, last = rows[0], rows[STEPS]
    assert last["strict"]["mean"] >= first["strict"]["mean"] + 0.15, (first["strict"], last["strict"])
    assert last["strict"]["up"] > last["strict"]["down"] and last["strict"]["p"] < ALPHA, last["strict"]
    omo = last["own_minus_other"]
    assert omo["mean"] > first["own_minus_other"]["mean"] and omo["p"] < ALPHA, omo
    assert abs(last["other"]["mean"] - first["other"]["mean"]) < 0.02, (first["other"], last["other"])
