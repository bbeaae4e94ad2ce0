"""GroupedRewardScheduler without a model: out-of-order micro-batches, only whole groups submitted (each image
exactly once), a raising reward gives invalid entries, per-reward counters summed over chunks."""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

import pytest
import torch

from deepgen_rl.rewards.base import Reward
from deepgen_rl.trainer.reward_overlap import GroupedRewardScheduler

N, G = 12, 3  # 4 groups of 3


class IndexReward(Reward):
    """Score = the image itself (the images are their row index as a float); records every call's images."""

    def __init__(self):
        self.calls: list[list[float]] = []

    def score(self, images, prompts, metadata):
        self.calls.append(list(images))
        return torch.tensor(images, dtype=torch.float32), torch.ones(len(images), dtype=torch.bool), {}


class RaisingReward(Reward):
    def score(self, images, prompts, metadata):
        raise RuntimeError("service down")


def _immediate(fn, *args) -> Future:
    """A synchronous submit_fn: runs at once, so the call order is the submission order."""
    fut: Future = Future()
    fut.set_result(fn(*args))
    return fut


def _scheduler(rewards, submit_fn=_immediate, weights=None):
    names = list(rewards)
    prompts = [f"p{i // G}" for i in range(N)]
    metadata = [{"group_id": i // G} for i in range(N)]
    if weights is None:
        weights = torch.ones(N, len(names))
    return GroupedRewardScheduler(submit_fn, rewards, names, prompts, metadata, weights, group_size=G)


def test_out_of_order_micro_batches_submit_only_whole_group_prefixes_once():
    reward = IndexReward()
    sched = _scheduler({"idx": reward})
    # micro-batches of 4 images (not aligned to groups of 3), arriving 2, 0, 1
    mbs = [list(range(s, s + 4)) for s in range(0, N, 4)]
    sched.on_micro_batch(mbs[2], [float(i) for i in mbs[2]])
    assert reward.calls == []  # images 0..7 missing: nothing is a complete prefix
    sched.on_micro_batch(mbs[0], [float(i) for i in mbs[0]])
    assert reward.calls == [[0.0, 1.0, 2.0]]  # group 0 only: image 3 starts group 1, whose images 4, 5 are missing
    sched.on_micro_batch(mbs[1], [float(i) for i in mbs[1]])
    assert reward.calls == [[0.0, 1.0, 2.0], [float(i) for i in range(3, N)]]
    out = sched.collect()
    assert torch.equal(out.scores[:, 0], torch.arange(N, dtype=torch.float32))
    assert out.valid.all()
    assert out.info["per_reward"]["idx"]["num_scored"] == N
    chunks = [sel for sel, _ in sched.chunks]
    assert all(len(sel) % G == 0 and sel[0] % G == 0 for sel in chunks)  # whole groups only
    assert sorted(i for sel in chunks for i in sel) == list(range(N))  # every image exactly once


def test_a_raising_reward_gives_invalid_entries_and_the_others_still_score():
    sched = _scheduler({"idx": IndexReward(), "down": RaisingReward()})
    with ThreadPoolExecutor(2) as pool:
        sched.submit_fn = pool.submit
        for s in range(0, N, G):
            sched.on_micro_batch(list(range(s, s + G)), [float(i) for i in range(s, s + G)])
        out = sched.collect()
    assert out.valid[:, 0].all() and not out.valid[:, 1].any()
    assert torch.equal(out.scores[:, 1], torch.zeros(N))  # placeholders, never a fake score that is marked valid
    assert out.info["per_reward"]["down"]["num_failed"] == N


def test_zero_weight_is_skipped_not_scored():
    weights = torch.ones(N, 1)
    weights[:G] = 0
    reward = IndexReward()
    sched = _scheduler({"idx": reward}, weights=weights)
    sched.on_micro_batch(list(range(N)), [float(i) for i in range(N)])
    out = sched.collect()
    assert not out.valid[:G].any() and out.valid[G:].all()
    assert out.info["per_reward"]["idx"]["num_skipped"] == G and reward.calls == [[float(i) for i in range(G, N)]]


def test_collect_refuses_an_incomplete_delivery_and_duplicates_are_refused():
    sched = _scheduler({"idx": IndexReward()})
    sched.on_micro_batch([0, 1, 2, 3], [0.0, 1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="delivered twice"):
        sched.on_micro_batch([3], [3.0])
    with pytest.raises(RuntimeError, match="only 3 of 12"):
        sched.collect()
