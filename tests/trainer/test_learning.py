"""Learning test: MR-GRPO on the tiny model raises a learnable programmatic reward (mean image brightness), and
with the sign of the advantages flipped the same run lowers it.

Statistics: the per-step mean reward r_s (32 images) is regressed on the step index; under "no learning" r_s is a
stationary sequence and the slope's t-statistic is ~N(0, 1). We require t > 4 (t < -4 when flipped), i.e. a
one-sided false-positive rate below 1e-4, and the last-5 mean above the first-5 mean.
"""

from __future__ import annotations

import pytest
import torch

from tests.trainer.helpers import run_inprocess, tiny_model

STEPS = 24
LEARN = dict(max_steps=STEPS, rollout_n=8, rollout_micro_batch_size=32, atrain_micro_batch_size=32,
             num_inference_steps=6, learning_rate=3e-3, clip_range=0.2, atrain_adv_type="gdpo", seed=3)


def slope_t(values: list[float]) -> float:
    y = torch.tensor(values, dtype=torch.float64)
    x = torch.arange(len(values), dtype=torch.float64)
    xc, yc = x - x.mean(), y - y.mean()
    slope = (xc * yc).sum() / (xc * xc).sum()
    resid = yc - slope * xc
    se = torch.sqrt((resid * resid).sum() / (len(values) - 2) / (xc * xc).sum())
    return float(slope / se)


@pytest.mark.slow
@pytest.mark.parametrize("sampler,eta,algorithm", [("cps_sde", 0.7, "flowgrpo"), ("flowgrpo_sde", 0.7, "flowgrpo"),
                                                   ("flowgrpo_sde", 0.7, "grpoguard"),
                                                   ("cps_sde", 0.7, "diffusionnft")])
def test_reward_rises(tmp_path, sampler, eta, algorithm):
    _, history = run_inprocess(tmp_path, model=tiny_model(), atrain_sde_sampler=sampler, sde_eta=eta,
                               atrain_algorithm=algorithm, **LEARN)
    r = [m["reward/total"] for m in history]
    t = slope_t(r)
    print(sampler, algorithm, [round(x, 4) for x in r], "t =", t)
    assert t > 4.0, (t, r)
    assert sum(r[-5:]) / 5 > sum(r[:5]) / 5


@pytest.mark.slow
def test_reward_falls_with_flipped_advantages(tmp_path):
    _, history = run_inprocess(tmp_path, model=tiny_model(), atrain_sde_sampler="cps_sde", sde_eta=0.7,
                               negate_advantages=True, **LEARN)
    r = [m["reward/total"] for m in history]
    t = slope_t(r)
    print("flipped", [round(x, 4) for x in r], "t =", t)
    assert t < -4.0, (t, r)
    assert sum(r[-5:]) / 5 < sum(r[:5]) / 5
