"""One GRPO step, in-process on the tiny model: optimizer steps, ratio at the first update, VLM forwards,
reward routing and failure handling, host transfers per update."""

from __future__ import annotations

import sys

import pytest
import torch

from deepgen_rl.rewards.base import Reward
from deepgen_rl.rl.samplers import SDE_SAMPLERS
from deepgen_rl.trainer.policy import PieceStats, UpdateStats
from tests.trainer.helpers import DEMO_PROGRAMMATIC, ROOT, make_args, run_inprocess, tiny_model

SFT_DEMO = str(ROOT / "assets/sftaux/demo.py")


def test_one_optimizer_step_per_rollout_batch(tmp_path, monkeypatch):
    model = tiny_model()
    calls = {"n": 0}
    from deepgen_rl.trainer.grpo_trainer import DeepGenGRPOTrainer

    orig = DeepGenGRPOTrainer._setup_optimization

    def counting_setup(self, max_steps):
        orig(self, max_steps)
        step = self.optimizer.step

        def counted(*a, **k):
            calls["n"] += 1
            return step(*a, **k)

        self.optimizer.step = counted

    monkeypatch.setattr(DeepGenGRPOTrainer, "_setup_optimization", counting_setup)
    # 2 micro-batches x 3 trained timesteps = 6 backward passes per update, 2 updates per rollout batch
    trainer, history = run_inprocess(tmp_path, model=model, max_steps=3, atrain_micro_batch_size=4,
                                     num_inference_steps=5, timestep_fraction=0.6, atrain_num_actor_update_steps=2)
    assert calls["n"] == 3 * 2
    assert [m["train/optimizer_steps"] for m in history] == [2.0, 4.0, 6.0]


def test_ratio_is_one_at_first_update_for_every_sampler(tmp_path):
    model = tiny_model()
    for sampler in SDE_SAMPLERS:
        eta = 0.3 if sampler == "dance_sde" else 0.7
        _, history = run_inprocess(tmp_path / sampler, model=model, max_steps=2, atrain_sde_sampler=sampler,
                                   sde_eta=eta, atrain_micro_batch_size=4)
        for m in history:
            assert m["train/first_ratio_max_abs_dev"] < 1e-6, (sampler, m["train/first_ratio_max_abs_dev"])
        # the first update changed the weights, so step 2's rollout is a new policy but its ratio is still 1
        assert history[-1]["train/optimizer_steps"] == 2.0


def test_vlm_forwards_equal_distinct_prompts(tmp_path):
    model = tiny_model()
    rows = []

    def count_rows(module, args, kwargs):
        rows.append(kwargs["inputs_embeds"].shape[0])

    # every VLM decoder forward, whoever calls it
    model._text_model().register_forward_pre_hook(count_rows, with_kwargs=True)
    _, history = run_inprocess(tmp_path, model=model, max_steps=2, rollout_n=4, rollout_micro_batch_size=12)
    # 12 images / 4 per prompt = 3 prompts per step; each encoded once (not once per image)
    assert sum(rows) == 2 * 3, rows
    assert [m["train/vlm_prompt_encodings"] for m in history] == [3.0, 3.0]


class RecordingReward(Reward):
    """Scores = mean brightness; records the prompts it was asked about; fails on prompts containing 'FAIL'."""

    def __init__(self):
        self.seen: list[str] = []

    def score(self, images, prompts, metadata):
        self.seen.extend(prompts)
        scores, valid = [], []
        for im, p in zip(images, prompts):
            ok = "FAIL" not in p
            valid.append(ok)
            scores.append(float(torch.tensor(list(im.getdata()), dtype=torch.float32).mean() / 255) if ok else 123.0)
        return torch.tensor(scores), torch.tensor(valid), {}


class ExplodingReward(Reward):
    def score(self, images, prompts, metadata):
        raise RuntimeError("reward service down")


def _write_mixture(tmp_path):
    (tmp_path / "a.txt").write_text("\n".join(f"apple {i}" for i in range(8)) + "\n")
    (tmp_path / "b.txt").write_text("\n".join(f"FAIL banana {i}" for i in range(8)) + "\n")
    (tmp_path / "mix.yaml").write_text(
        "sampling_mode: weight_only\n"
        "datasets:\n"
        "  - name: a\n    path: a.txt\n    sample_weight: 1.0\n    rewards:\n      - rec: 1.0\n      - boom: 0.0\n"
        "  - name: b\n    path: b.txt\n    sample_weight: 1.0\n    rewards:\n      - rec: 0.5\n      - other: 0.5\n")
    return str(tmp_path / "mix.yaml")


def test_rewards_only_for_weighted_samples_and_failures_are_invalid(tmp_path):
    rec, other = RecordingReward(), RecordingReward()
    rewards = {"rec": rec, "boom": ExplodingReward(), "other": other}
    trainer, history = run_inprocess(tmp_path / "out", dataset_config=_write_mixture(tmp_path), rewards=rewards,
                                     max_steps=3, rollout_n=4, rollout_micro_batch_size=8)
    # 'boom' has weight 0 everywhere: never called (an exception would have been recorded as failures)
    assert all(m["reward_calls/boom"] == 0 for m in history)
    assert all(m["reward_failures/boom"] == 0 for m in history)
    # 'other' is weighted only for dataset b: it saw only banana prompts
    assert other.seen and all(p.startswith("FAIL banana") for p in other.seen)
    # rec saw both datasets; banana prompts failed -> counted as failures, never scored as 123 (or 0)
    n_banana = sum(p.startswith("FAIL") for p in rec.seen)
    assert n_banana > 0
    assert sum(m["reward_failures/rec"] for m in history) == n_banana
    # a fabricated 123 would show up in the mean; a step with only failed samples has no mean at all (NaN)
    assert all(m["reward/rec"] < 1.0 or m["reward/rec"] != m["reward/rec"] for m in history)


def test_exploding_weighted_reward_marks_samples_invalid(tmp_path):
    (tmp_path / "a.txt").write_text("\n".join(f"apple {i}" for i in range(8)) + "\n")
    (tmp_path / "m.yaml").write_text("datasets:\n  - name: a\n    path: a.txt\n    rewards:\n"
                                     "      - rec: 0.5\n      - boom: 0.5\n")
    rewards = {"rec": RecordingReward(), "boom": ExplodingReward()}
    _, history = run_inprocess(tmp_path / "out", dataset_config=str(tmp_path / "m.yaml"), rewards=rewards,
                               max_steps=1, rollout_n=4, rollout_micro_batch_size=8)
    m = history[0]
    assert m["reward_failures/boom"] == 8 and m["reward_calls/boom"] == 8
    assert m["reward/boom"] != m["reward/boom"]  # NaN: no valid score at all, nothing fabricated
    assert m["advantage/num_partial_reward"] == 8


def test_ema_follows_the_closed_form(tmp_path):
    """ema_0 = θ_0; ema_t = d·ema_{t-1} + (1-d)·θ_t after each optimizer step (checked from the checkpoints)."""
    from safetensors.torch import load_file

    model = tiny_model()
    theta0 = {k: v.detach().clone().float() for k, v in model.transformer.state_dict().items()}
    d = 0.6
    run_inprocess(tmp_path, model=model, max_steps=2, save_steps=1, ema_decay=d)
    theta1 = load_file(str(tmp_path / "checkpoint-1" / "dit.safetensors"))
    theta2 = load_file(str(tmp_path / "checkpoint-2" / "dit.safetensors"))
    ema2 = load_file(str(tmp_path / "checkpoint-2" / "ema_dit.safetensors"))
    names = [n for n, _ in model.transformer.named_parameters()]
    assert set(names) <= set(ema2)
    moved = 0
    for k in names:
        expected = d * (d * theta0[k] + (1 - d) * theta1[k]) + (1 - d) * theta2[k]
        assert torch.allclose(ema2[k], expected, atol=1e-6), k
        moved += int(not torch.equal(ema2[k], theta2[k]))
    assert moved > 0  # the EMA is not just a copy of the live weights


def test_update_stats_equal_the_per_piece_float_sums_exactly():
    """UpdateStats (device float64) against the host arithmetic the trainer did with one float per piece."""
    g = torch.Generator().manual_seed(0)
    pieces = [(PieceStats(("policy_loss", "ratio_max_abs_dev"), torch.randn(2, generator=g).abs()), count)
              for count in (3, 4, 1, 4, 2)]
    sums = UpdateStats()
    host: dict[str, float] = {}
    for stats, count in pieces:
        sums.add(stats, count, 14, 3)
        sums.running_max("first_ratio_max_abs_dev", stats, "ratio_max_abs_dev")
        floats = dict(zip(stats.names, stats.tensor.tolist()))
        for k, v in floats.items():
            host[k] = host.get(k, 0.0) + v * count / 14 / 3
        host["first_ratio_max_abs_dev"] = max(host.get("first_ratio_max_abs_dev", 0.0), floats["ratio_max_abs_dev"])
    sums.set("sft_loss", torch.tensor(0.125, dtype=torch.bfloat16))
    host["sft_loss"] = 0.125
    assert sums.to_host() == host and list(sums.to_host()) == list(host)  # same values, same key order
    assert UpdateStats().to_host() == {}
    # read as a mapping, a piece's stats are floats (one copy for all of them)
    stats = pieces[0][0]
    assert set(stats) == {"policy_loss", "ratio_max_abs_dev"} and "kl" not in stats
    assert all(isinstance(v, float) for v in stats.values())


TRANSFERS = ("item", "tolist", "__float__", "__bool__", "__int__", "cpu", "numpy")


def _update_transfers(tmp_path, monkeypatch, sftaux_dataset_config=None, **overrides):
    """Per policy update: the tensor-to-host conversions (TRANSFERS) called from the update's code
    (deepgen_rl/trainer, deepgen_rl/rl) outside the finite check, and per finite check its conversions.

    Reads of the rollout batch's host-resident storage (σ schedule, CPU trajectory) are not device syncs and are not
    counted. The DiT forward's own syncs (models/, e.g. the text-mask trim) are outside this count.
    """
    from deepgen_rl.trainer.grpo_trainer import DeepGenGRPOTrainer

    code = (str(ROOT / "deepgen_rl/trainer"), str(ROOT / "deepgen_rl/rl"))
    state = {"counter": None, "host": set()}
    updates, finite_checks = [], []

    def counting(name):
        orig = getattr(torch.Tensor, name)

        def wrapper(self, *a, **k):
            counter = state["counter"]
            if counter is not None and sys._getframe(1).f_code.co_filename.startswith(code) and \
                    self.untyped_storage().data_ptr() not in state["host"]:
                counter[-1] += 1
            return orig(self, *a, **k)
        return wrapper

    orig_update, orig_finite = DeepGenGRPOTrainer._policy_update, DeepGenGRPOTrainer._all_finite

    def update(self, batch, *a, **k):
        state["host"] = {t.untyped_storage().data_ptr() for t in (batch.latents, batch.log_probs, batch.sigmas,
                                                                   batch.stochastic, batch.cond_index)
                         if t.device.type == "cpu"}
        updates.append(0)
        state["counter"] = updates
        try:
            return orig_update(self, batch, *a, **k)
        finally:
            state["counter"] = None

    def finite(self, loss):
        finite_checks.append(0)
        state["counter"] = finite_checks
        try:
            return orig_finite(self, loss)
        finally:
            state["counter"] = updates

    with monkeypatch.context() as mp:  # undone before the next run (which would otherwise wrap these wrappers)
        for name in TRANSFERS:
            mp.setattr(torch.Tensor, name, counting(name))
        mp.setattr(DeepGenGRPOTrainer, "_policy_update", update)
        mp.setattr(DeepGenGRPOTrainer, "_all_finite", finite)
        trainer = DeepGenGRPOTrainer(tiny_model(), make_args(tmp_path, max_steps=2, **overrides),
                                     dataset_config=DEMO_PROGRAMMATIC, sftaux_dataset_config=sftaux_dataset_config)
        history = trainer.train(resume_from_checkpoint=False)
    return updates, finite_checks, history


@pytest.mark.parametrize("sft", [False, True])
def test_host_transfers_per_update_do_not_grow_with_the_pieces(tmp_path, monkeypatch, sft):
    """2 pieces (1 micro-batch x 2 steps) vs 20 (4 x 5), with and without the SFT term: the update's statistics
    reach the host in ONE transfer (plus the gradient norm's), whatever the number of pieces; the one per-piece sync
    left is the finite check, one transfer each (it decides whether the piece's backward runs)."""
    extra = dict(sftaux_coef=0.5, sftaux_micro_batch_size=2, sftaux_dataset_config=SFT_DEMO) if sft else {}
    runs = {}
    for pieces, layout in ((2, dict(atrain_micro_batch_size=8, num_inference_steps=4, timestep_fraction=0.6)),
                           (20, dict(atrain_micro_batch_size=2, num_inference_steps=6, timestep_fraction=0.9))):
        runs[pieces] = _update_transfers(tmp_path / str(pieces), monkeypatch, **layout, **extra)
    for pieces, (updates, finite_checks, history) in runs.items():
        assert updates == [2, 2], (pieces, updates)  # the stats' to_host + the gradient norm, per update
        assert finite_checks == [1] * 2 * (pieces + sft), (pieces, finite_checks)
        assert all(m["train/nonfinite_losses"] == 0 and m["train/optimizer_steps"] > 0 for m in history)
        assert ("train/sft_loss" in history[0]) == sft


def test_update_indices_keep_nonzero_advantages_and_pad_to_the_busiest_rank():
    from deepgen_rl.trainer.policy import update_indices

    a = torch.tensor([0.0, 1.0, 1e-8, 0.0,   -2.0, 0.5, 3.0, 0.0])  # rank 0: one |A| > 1e-6; rank 1: three
    assert update_indices(a, 0, 4, None) == [0, 1, 2, 3]
    assert update_indices(a, 1, 4, 1e-6) == [0, 1, 2]
    assert update_indices(a, 0, 4, 1e-6) == [0, 1, 2]  # image 1 plus its first two skipped images, in order
    assert update_indices(a, 0, 4, 0.0) == [0, 1, 2]  # tol 0: 1e-8 counts as non-zero (rank 0 keeps 1, 2)
    assert update_indices(torch.zeros(8), 1, 4, 1e-6) == [0]  # always one image: the boundary backward
    assert update_indices(torch.tensor([0.0, 2.0, 0.0]), 0, 3, 1e-6) == [1]  # one rank: no padding
