"""One GRPO step, in-process on the tiny model: optimizer steps, ratio at the first update, VLM forwards,
reward routing and failure handling."""

from __future__ import annotations

import torch

from deepgen_rl.rewards.base import Reward
from deepgen_rl.rl.samplers import SDE_SAMPLERS
from tests.trainer.helpers import run_inprocess, tiny_model


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
