"""Trainer options beyond the defaults, each checked for a property that would fail if it were wired wrong:
KL to the frozen reference, GRPO-Guard, DiffusionNFT, the SDE window, CFG during the update, other advantage types."""

from __future__ import annotations

import pytest
import torch

from deepgen_rl.rl.advantages import ADV_TYPES
from deepgen_rl.rl.losses import KL_TYPES
from deepgen_rl.trainer import grpo_trainer
from tests.trainer.helpers import run_inprocess, tiny_model


def _dit_changed(model, trainer) -> bool:
    return any(not torch.equal(a, b) for a, b in zip(model, trainer.dit_module.parameters()))


@pytest.mark.parametrize("kl_type", KL_TYPES)
def test_kl_is_zero_before_the_first_update_and_positive_after(tmp_path, kl_type):
    _, history = run_inprocess(tmp_path, max_steps=2, beta=0.01, atrain_kl_type=kl_type, atrain_micro_batch_size=4)
    assert history[0]["train/kl"] == 0.0  # θ = reference exactly until the first optimizer step
    assert history[1]["train/kl"] > 0.0


def test_kl_off_builds_no_reference(tmp_path):
    trainer, history = run_inprocess(tmp_path, max_steps=1, beta=0.0)
    assert trainer.ref_dit is None and "train/kl" not in history[0]


@pytest.mark.parametrize("algorithm,sampler", [("grpoguard", "flowgrpo_sde"), ("grpoguard", "cps_sde"),
                                               ("diffusionnft", "cps_sde")])
def test_algorithms_update_once_per_step(tmp_path, algorithm, sampler):
    model = tiny_model()
    before = [p.detach().clone() for p in model.transformer.parameters()]
    trainer, history = run_inprocess(tmp_path, model=model, max_steps=2, atrain_algorithm=algorithm,
                                     atrain_sde_sampler=sampler, atrain_micro_batch_size=4)
    assert [m["train/optimizer_steps"] for m in history] == [1.0, 2.0]
    assert all(m["train/nonfinite_losses"] == 0 for m in history)
    assert _dit_changed(before, trainer)
    if algorithm == "grpoguard":  # normalised ratio is exactly 1 before the first update
        assert history[0]["train/ratio_max_abs_dev"] < 1e-6


def test_sde_window_trains_only_the_window(tmp_path, monkeypatch):
    seen: list[list[int]] = []
    orig = grpo_trainer.policy_piece_loss

    def recording(trainer, batch, advantages, mb, j):
        if not seen or len(seen[-1]) >= 2 * 2:  # 2 micro-batches x window of 2 steps per update
            seen.append([])
        seen[-1].append(j)
        # ODE steps outside the window have log-prob exactly 0; the window's steps are stochastic
        assert bool(batch.stochastic[j])
        return orig(trainer, batch, advantages, mb, j)

    monkeypatch.setattr(grpo_trainer, "policy_piece_loss", recording)
    _, history = run_inprocess(tmp_path, max_steps=3, num_inference_steps=6, sde_window_size=2,
                               atrain_sde_sampler="flowgrpo_sde", atrain_micro_batch_size=4)
    assert len(seen) == 3
    for js in seen:
        window = sorted(set(js))
        assert len(window) == 2 and window[1] == window[0] + 1 and window[1] <= 4  # never the last step (5)


def test_cfg_in_rollout_and_update_is_consistent(tmp_path):
    _, history = run_inprocess(tmp_path, max_steps=2, cfg_scale=4.0, atrain_micro_batch_size=4)
    assert all(m["train/first_ratio_max_abs_dev"] < 1e-6 for m in history)
    assert [m["train/vlm_prompt_encodings"] for m in history] == [3.0, 3.0]  # 2 prompts + the empty prompt


def _closed_form_advantages(adv_type, r, g):
    """The advantages of a batch with one reward of weight 1, every value valid (docs/training.md#advantages)."""
    eps = 1e-4

    def standardise(x, groups):  # (x − group mean) / (group std + ε)
        out = torch.empty_like(x)
        for gid in groups.unique():
            m = groups == gid
            out[m] = (x[m] - x[m].mean()) / (x[m].std() + eps)
        return out

    if adv_type == "grpo":
        return standardise(r, g)
    if adv_type == "grpo_global_std":  # the group's mean, the batch's std
        return torch.stack([r[i] - r[g == g[i]].mean() for i in range(len(r))]) / (r.std() + eps)
    if adv_type == "reinforcepp":
        return (r - r.mean()) / (r.std() + eps)
    if adv_type == "gdpo":  # per-reward group standardisation, then the batch's
        return standardise(standardise(r, g), torch.zeros_like(g))
    pytest.fail(f"add a closed form for advantage type {adv_type!r} to this test")


@pytest.mark.parametrize("adv_type", ADV_TYPES)
def test_every_advantage_type_trains_on_its_closed_form(tmp_path, adv_type):
    trainer, history = run_inprocess(tmp_path, max_steps=1, atrain_adv_type=adv_type, save_rollout_records=True)
    import json

    recs = [json.loads(x) for x in (tmp_path / "rollouts" / "step_1" / "rank_0.jsonl").read_text().splitlines()]
    r = torch.tensor([x["rewards"]["brightness"] for x in recs], dtype=torch.float64)
    a = torch.tensor([x["advantage"] for x in recs], dtype=torch.float64)
    g = torch.tensor([x["group_id"] for x in recs])
    expected = _closed_form_advantages(adv_type, r, g).clamp(-5, 5)
    assert torch.allclose(a, expected, atol=1e-5)
    assert history[0]["train/optimizer_steps"] == 1.0


def test_trajectory_on_device(tmp_path):
    _, history = run_inprocess(tmp_path, max_steps=1, trajectory_device="device")
    assert history[0]["train/first_ratio_max_abs_dev"] < 1e-6
