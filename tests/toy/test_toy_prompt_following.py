"""The toy world's headline claim, end to end through ``bash scripts/toy_prompt_following.sh`` with its defaults:
MR-GRPO (cps_sde, gdpo; two gloo ranks, a one-step SDE window starting at step 3-5, ``soft_color``, the SFT anchor, an
EMA of the DiT, RL prompts mixing held-out relations with train-split count and region captions, ``--cpu_fast_gelu``,
``--reuse_last_velocity``) on the ``slots_wide`` toy model, trained for 14.75 minutes from launch
(``--max_train_minutes`` with ``--max_train_minutes_from``: it stops before a step that, with an eval after it, would
end later, then evaluates and saves that step), raises held-out strict accuracy by at least 15 points at its last eval,
within 15 minutes of launch (the issue's target), and the rise is prompt following.

Opt-in (DEEPGEN_TOY_SLOW_TESTS=1; ~15 minutes plus the `slots_wide` build, ~8-13 minutes, cached): too long for CI,
whose toy RL test is tests/toy/test_toy_rl.py. Seed 0, the script's defaults (evals every 20 steps and at the last).
The step reached depends on the machine's speed (75-91 on the slowest machine met, AVX2 only, whose speed varies by up
to ~25% within an hour; more on faster ones); the run up to it is the same on every AVX2 machine (pinned numerics). On
the AVX2-only machine of 2026-12-07 seed 0's run stopped after step 75 and gained +15.6 in 14.7 minutes, so the test
passed there (+16.2 at step 77 in a run while the machine was a little faster); seeds 1-4 gained +17.4 to +19.3
(docs/toy_world.md, "Windows from steps 3-5; the budget from launch"). On the current two-rank build (MKL's strict
mode) seed 0 gains +18.6 on the Intel Xeon of 2026-12-07 but +13.7 (step 108) on the AMD EPYC of 2026-12-08, which
builds another model: this test fails there (docs/toy_world.md, "CI's RL test on the AMD build: three looks").

Asserted at the last eval (64 held-out prompts x 8 images, ODE, fixed seeds), each one-sided exact sign test over the
prompts whose outcome changed (`deepgen_rl.toy.rl_run.paired_sign_test`) at false-positive rate <= alpha = 0.01:
  * it comes at most 15 minutes after launch (the budget's purpose);
  * strict accuracy >= step 0 + 0.15 (the issue's target, a magnitude; measured 0.342 -> 0.498) and per prompt up
    more than down (p < alpha; measured 37 up / 8 down, p = 7.7e-6);
  * own - other (a prompt's claim score minus the same images' score on 8 other prompts' claims) up per prompt
    (p < alpha; measured 0.430 -> 0.585, 56 up / 8 down, p = 2.8e-10): a prompt-blind change (brighter, greener,
    more objects) lifts both terms alike;
  * the other-prompt score moves by less than 0.02 (it does not learn to satisfy any caption; measured 0.219 ->
    0.220).
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
EVAL_EVERY = 20

pytestmark = pytest.mark.skipif(
    os.environ.get("DEEPGEN_TOY_SLOW_TESTS") != "1",
    reason="opt-in (~15 minutes on 2 idle cores, plus the slots_wide build): set DEEPGEN_TOY_SLOW_TESTS=1")


@pytest.mark.slow
def test_headline_run_raises_heldout_strict_accuracy_by_15_points_and_follows_prompts(tmp_path):
    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items()
           if k not in ("TOY_STEPS", "TOY_MINUTES", "TOY_EVAL_EVERY", "TOY_VARIANT", "NGPUS")}
    env.update(TOY_SEED="0", TOY_OUTPUT_DIR=str(out))  # the script's defaults, as a user runs it
    t0 = time.time()
    proc = subprocess.run(["bash", "scripts/toy_prompt_following.sh"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=3600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    print(proc.stdout[-2500:])
    print(f"wall: {(time.time() - t0) / 60:.1f} minutes (build and SFT pairs included when not cached)")
    rows = {r["step"]: r for r in json.loads((out / "report.json").read_text())}
    end = max(rows)  # the step the budget stopped at: every EVAL_EVERY-th step and that one are evaluated
    assert sorted(rows) == sorted({*range(0, end + 1, EVAL_EVERY), end}) and end > EVAL_EVERY, sorted(rows)
    first, last = rows[0], rows[end]
    assert last["minutes"] <= 15.0, last["minutes"]
    assert last["strict"]["mean"] >= first["strict"]["mean"] + 0.15, (first["strict"], last["strict"])
    assert last["strict"]["up"] > last["strict"]["down"] and last["strict"]["p"] < ALPHA, last["strict"]
    omo = last["own_minus_other"]
    assert omo["mean"] > first["own_minus_other"]["mean"] and omo["p"] < ALPHA, omo
    assert abs(last["other"]["mean"] - first["other"]["mean"]) < 0.02, (first["other"], last["other"])
