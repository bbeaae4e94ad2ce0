"""Rollout engine on the tiny model: noise sharing/independence, stored trajectories, log-probs, determinism; the
per-image metadata (prompt-file fields + rollout keys) that every reward call receives, through a real training
step."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from deepgen_rl.rl.samplers import make_sigmas, sde_step
from deepgen_rl.rollout import expand_groups, rollout

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from _common import counting_dit_rows  # noqa: E402  (the rollout benches' DiT-row counter)


@dataclass
class Item:
    prompt: str
    dataset: str
    group_id: int
    prompt_index: int = 0


@pytest.fixture(scope="module")
def model():
    from deepgen_rl.models import build_model

    return build_model("configs/models/deepgen_tiny.py")


def _run(model, items, **kw):
    T = 4
    args = dict(rollout_n=4, micro_batch_size=3, sigmas=make_sigmas(T, model.scheduler_shift),
                stochastic=torch.ones(T, dtype=torch.bool), sampler="flowgrpo_sde", eta=0.7, height=32, width=32,
                seed=7, step=0, rank=0)
    args.update(kw)
    return rollout(model, items, **args)


def test_shared_noise_survives_micro_batch_split(model):
    # 2 groups x 4 images, micro-batches of 3: group 0 spans micro-batches 0 and 1
    b = _run(model, [Item("a red car", "d", 10), Item("a blue bird", "d", 11)], init_same_noise=True)
    x_T = b.latents[:, 0]
    for g in range(2):
        for k in range(1, 4):
            assert torch.equal(x_T[4 * g], x_T[4 * g + k])
    assert not torch.equal(x_T[0], x_T[4])
    # the SDE noise still differs inside a group, so the images differ
    assert not torch.equal(b.latents[0, -1], b.latents[1, -1])


def test_independent_noise_and_ranks_differ(model):
    b0 = _run(model, [Item("a red car", "d", 10)], rank=0)
    b1 = _run(model, [Item("a red car", "d", 11)], rank=1)  # another rank's prompt has another global group id
    x0, x1 = b0.latents[:, 0], b1.latents[:, 0]
    assert len({float(x.sum()) for x in x0}) == 4  # independent within the group
    assert not torch.equal(x0, x1)
    again = _run(model, [Item("a red car", "d", 10)], rank=0)
    assert torch.equal(again.latents, b0.latents) and torch.equal(again.log_probs, b0.log_probs)


def test_trajectory_and_log_probs_are_consistent(model):
    b = _run(model, [Item("a cat", "d", 1)])
    T = 4
    assert b.latents.shape == (4, T + 1, 16, 4, 4) and b.latents.dtype == torch.float32
    assert b.log_probs.shape == (4, T) and b.log_probs.dtype == torch.float32
    assert len(b.images) == 4 and b.images[0].size == (32, 32)
    assert b.num_prompt_encodings == 1
    # re-scoring the stored transition with the same model gives the stored log-prob
    cond = b.cond.index_select(b.cond_index[:4])
    j = 1
    v = model.predict_velocity(b.latents[:, j], torch.full((4,), float(b.sigmas[j])), cond)
    out = sde_step("flowgrpo_sde", v, b.latents[:, j], float(b.sigmas[j]), float(b.sigmas[j + 1]), 0.7,
                   prev_sample=b.latents[:, j + 1])
    assert torch.allclose(out.log_prob, b.log_probs[:, j], atol=1e-6)
    # the last stored latent decodes to the returned images
    px = torch.tensor(list(b.images[0].getdata()), dtype=torch.float32).mean() / 255
    dec = model.decode_latents(b.latents[:1, -1]).mean()
    assert abs(float(px) - float(dec)) < 2e-3


def _counted_run(model, items, **kw):
    """``_run`` and the rows of each DiT call it made."""
    with counting_dit_rows(model) as calls:
        return _run(model, items, **kw), calls


def test_cfg_uses_one_batched_forward(model):
    b, calls = _counted_run(model, [Item("a cat", "d", 1)], cfg_scale=4.0, micro_batch_size=4)
    assert calls == [8] * 4  # cond + uncond stacked, one forward per step
    assert b.num_prompt_encodings == 2  # the prompt + the empty prompt


@pytest.mark.parametrize("cfg_scale", [0.0, 4.0])
def test_shared_ode_prefix_runs_once_per_group_and_matches_the_per_image_rollout(model, cfg_scale):
    # T = 6, the SDE window is steps 3 and 4: steps 0-2 are ODE from a group's shared x_T. 3 groups x 4 images in
    # micro-batches of 5: micro-batch 0 holds groups {10: 4 rows, 11: 1 row}, 1 holds {11: 3, 12: 2}, 2 holds {12: 2}.
    T = 6
    stochastic = torch.tensor([False, False, False, True, True, False])
    items = [Item("a red car", "d", 10), Item("a blue bird", "d", 11), Item("a red car", "d", 12)]
    kw = dict(sigmas=make_sigmas(T, model.scheduler_shift), stochastic=stochastic, init_same_noise=True,
              micro_batch_size=5, cfg_scale=cfg_scale)
    (shared, calls_shared), (plain, calls_plain) = (_counted_run(model, items, share_ode_prefix=share, **kw)
                                                    for share in (True, False))
    k = 2 if cfg_scale > 1.0 else 1  # CFG stacks cond + uncond in one forward
    # closed form: per micro-batch, 3 prefix steps on (groups in it) rows, then 3 steps on all its rows
    assert calls_shared == [k * r for r in [2] * 3 + [5] * 3 + [2] * 3 + [5] * 3 + [1] * 3 + [2] * 3]
    assert calls_plain == [k * r for r in [5] * 6 + [5] * 6 + [2] * 6]
    # a group's images in one micro-batch are bit-identical through the prefix (in two micro-batches: equal up to
    # rounding), then the window's noise separates them
    lat = shared.latents
    for a, b in [(0, 1), (0, 2), (0, 3), (5, 6), (5, 7), (8, 9), (10, 11)]:
        assert torch.equal(lat[a, :4], lat[b, :4]) and not torch.equal(lat[a, -1], lat[b, -1]), (a, b)
    for a, b in [(4, 5), (9, 10)]:
        assert torch.allclose(lat[a, :4], lat[b, :4], atol=1e-5, rtol=0) and not torch.equal(lat[a, -1], lat[b, -1])
    assert torch.equal(shared.log_probs[:, :3], torch.zeros(12, 3))
    # the same rollout as computing every image, up to float rounding (same SDE noise, same micro-batches)
    assert torch.allclose(lat, plain.latents, atol=1e-5, rtol=0)
    assert torch.allclose(shared.log_probs, plain.log_probs, atol=1e-3, rtol=1e-5)
    assert (shared.log_probs[:, 3:5] != 0).all()


def test_shared_ode_prefix_needs_shared_noise_and_a_late_first_stochastic_step(model):
    items = [Item("a red car", "d", 10)]
    for kw, want in [(dict(init_same_noise=False, stochastic=torch.tensor([False, True, True, False])), [4] * 4),
                     (dict(init_same_noise=True, stochastic=torch.ones(4, dtype=torch.bool)), [4] * 4),
                     (dict(init_same_noise=True, stochastic=torch.tensor([False, False, True, False])),
                      [1, 1, 4, 4])]:
        _, calls = _counted_run(model, items, micro_batch_size=4, **kw)
        assert calls == want, kw


@pytest.mark.parametrize("cfg_scale", [0.0, 4.0])
def test_reused_last_velocity_saves_one_forward_and_changes_only_the_last_latent(model, cfg_scale):
    # T = 4, window = step 1: step 0 is the shared ODE prefix, steps 2 and 3 are ODE; one group of 4 images
    T = 4
    sig = make_sigmas(T, model.scheduler_shift)
    kw = dict(sigmas=sig, stochastic=torch.tensor([False, True, False, False]), init_same_noise=True,
              micro_batch_size=4, cfg_scale=cfg_scale)
    items = [Item("a red car", "d", 10)]
    (plain, calls_plain), (reused, calls_reused) = (_counted_run(model, items, reuse_last_velocity=reuse, **kw)
                                                    for reuse in (False, True))
    k = 2 if cfg_scale > 1.0 else 1
    assert calls_plain == [k * r for r in [1, 4, 4, 4]] and calls_reused == [k * r for r in [1, 4, 4]]
    assert torch.equal(reused.latents[:, :T], plain.latents[:, :T]) and torch.equal(reused.log_probs, plain.log_probs)
    # closed form: x_0 = x_{T-1} - sigma_{T-1} * v(x_{T-2}, sigma_{T-2}), with v recomputed here
    from deepgen_rl.models.deepgen.model import guided_velocity

    cond = plain.cond.index_select(plain.cond_index)
    x2, x3 = plain.latents[:, 2], plain.latents[:, 3]
    s2, s3 = float(sig[2]), float(sig[3])
    with torch.no_grad():
        v2 = guided_velocity(model, x2, torch.full((4,), s2), cond, plain.uncond, cfg_scale)
        v3 = guided_velocity(model, x3, torch.full((4,), s3), cond, plain.uncond, cfg_scale)
    torch.testing.assert_close(x3, x2 + (s3 - s2) * v2, atol=1e-5, rtol=0)
    torch.testing.assert_close(reused.latents[:, T], x3 - s3 * v2, atol=1e-5, rtol=0)
    torch.testing.assert_close(plain.latents[:, T], x3 - s3 * v3, atol=1e-5, rtol=0)
    assert not torch.equal(reused.latents[:, T], plain.latents[:, T])


def test_reused_last_velocity_leaves_a_stochastic_last_step_alone(model):
    items = [Item("a red car", "d", 10)]
    (plain, calls_plain), (reused, calls_reused) = (
        _counted_run(model, items, reuse_last_velocity=reuse, micro_batch_size=4) for reuse in (False, True))
    assert calls_plain == calls_reused == [4] * 4
    assert torch.equal(plain.latents, reused.latents) and torch.equal(plain.log_probs, reused.log_probs)


def test_the_trainer_flag_takes_one_forward_per_rollout_image_off(tmp_path):
    """``--reuse_last_velocity`` reaches the trainer's rollout: one training step with a one-step SDE window runs
    exactly one DiT row per rollout image fewer (8 images: 2 prompts x 4), everything else alike."""
    from tests.trainer.helpers import run_inprocess, tiny_model

    rows = {}
    for flag in (False, True):
        model = tiny_model()
        with counting_dit_rows(model) as seen:
            run_inprocess(tmp_path / str(flag), model=model, max_steps=1, sde_window_size=1,
                          reuse_last_velocity=flag)
        rows[flag] = sum(seen)
    assert rows[False] - rows[True] == 8, rows


def test_expand_groups_puts_the_prompt_files_fields_under_the_rollout_keys():
    from deepgen_rl.data.prompts import PromptItem

    include = [{"class": "dog", "count": 2}]
    items = [PromptItem("two dogs", "g", 0, 5, group_id=40, metadata={"tag": "counting", "include": include}),
             Item("a cat", "t", group_id=41)]  # an item without metadata (rollout() accepts any such object)
    prompts, metadata = expand_groups(items, 2)
    assert prompts == ["two dogs", "two dogs", "a cat", "a cat"]
    assert metadata[1] == {"tag": "counting", "include": include, "dataset": "g", "group_id": 40, "prompt_index": 5,
                           "sample_index": 1}
    assert metadata[2] == {"dataset": "t", "group_id": 41, "prompt_index": 0, "sample_index": 0}
    metadata[0]["extra"] = 1  # each image has its own dict
    assert "extra" not in metadata[1] and "extra" not in items[0].metadata


def test_jsonl_fields_reach_the_rewards_in_a_training_step(tmp_path):
    """A real (tiny) training step on a .jsonl of GenEval records whose prompts match no GenEval template: geneval
    can only score them from the records' ``include`` lists, and a recording reward sees every record's fields."""
    import json

    from deepgen_rl.rewards import get_reward
    from deepgen_rl.rewards.base import Reward
    from deepgen_rl.rewards.geneval import Detection
    from tests.trainer.helpers import run_inprocess

    class OneDog:
        def detect(self, image, classes):
            return [Detection("dog", 0.95, (0, 0, 8, 8))]

    class Recording(Reward):
        def __init__(self):
            self.seen = []

        def score(self, images, prompts, metadata):
            self.seen.extend(zip(prompts, metadata))
            return torch.ones(len(images)), torch.ones(len(images), dtype=torch.bool), {}

    records = [{"prompt": f"render number {i}", "tag": "single_object", "include": [{"class": "dog", "count": 1}],
                "source_id": i} for i in range(8)]
    (tmp_path / "g.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")
    (tmp_path / "m.yaml").write_text("datasets:\n  - name: g\n    path: g.jsonl\n    rewards:\n"
                                     "      - geneval: 0.5\n      - rec: 0.5\n")
    rec = Recording()
    rewards = {"geneval": get_reward("geneval", detector=OneDog()), "rec": rec}
    _, history = run_inprocess(tmp_path / "out", dataset_config=str(tmp_path / "m.yaml"), rewards=rewards,
                               max_steps=1, rollout_n=4, rollout_micro_batch_size=8)
    assert rec.seen and all(meta["source_id"] == int(p.rsplit(" ", 1)[1]) and meta["include"] == records[0]["include"]
                            and meta["dataset"] == "g" for p, meta in rec.seen)
    m = history[0]
    assert m["reward_calls/geneval"] == len(rec.seen) and m["reward_failures/geneval"] == 0
    assert m["reward/geneval"] == 1.0  # without the records' metadata every sample would be "nothing to score"
