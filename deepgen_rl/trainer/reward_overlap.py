"""Reward scoring that overlaps the rollout: whole prompt groups are scored while later micro-batches generate.

:class:`GroupedRewardScheduler` is handed to ``rollout(on_micro_batch=...)``. Micro-batches may arrive in any
order; the scheduler keeps the decoded images and submits the longest prefix of images 0..m-1 that is made of
WHOLE groups (``group_size`` consecutive images share a prompt; pairwise judges need the complete group), each
prefix chunk exactly once, to ``submit_fn`` (an executor's ``submit``). :meth:`collect` waits for every chunk and
assembles the (N, K) scores and validity plus the per-reward counters summed over chunks.

Failure semantics are those of :func:`deepgen_rl.rewards.combine.compute_weighted_rewards`: a reward that raises
marks its samples ``valid=False`` (never a score).
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any, Callable, Sequence

import torch

from deepgen_rl.rewards.base import MultiRewardOutput, Reward
from deepgen_rl.rewards.combine import compute_weighted_rewards

COUNTERS = ("num_scored", "num_failed", "num_skipped", "latency_s")  # per-reward info summed over chunks


class GroupedRewardScheduler:
    """Scores N images (in the rollout's order) with K weighted rewards, a whole-group prefix at a time.

    Args:
        submit_fn: ``fn(callable, *args) -> Future`` (``ThreadPoolExecutor.submit``); runs the scoring.
        rewards: name -> Reward; reward_names: the K columns.
        prompts, metadata: the N per-image prompts and metadata (``expand_groups`` order).
        weights: (N, K) fp32 per-image reward weights.
        group_size: images per prompt (``--rollout_n``); N must be a multiple of it.
    """

    def __init__(self, submit_fn: Callable[..., Future], rewards: dict[str, Reward], reward_names: Sequence[str],
                 prompts: Sequence[str], metadata: Sequence[dict], weights: torch.Tensor, group_size: int):
        n = len(prompts)
        if len(metadata) != n or tuple(weights.shape) != (n, len(reward_names)):
            raise ValueError(f"{n} prompts, {len(metadata)} metadata, weights {tuple(weights.shape)} for "
                             f"{len(reward_names)} rewards")
        if group_size < 1 or n % group_size:
            raise ValueError(f"{n} images do not form whole groups of {group_size}")
        self.submit_fn, self.rewards, self.reward_names = submit_fn, rewards, list(reward_names)
        self.prompts, self.metadata, self.weights, self.group_size = list(prompts), list(metadata), weights, group_size
        self.images: dict[int, Any] = {}
        self.submitted = 0  # images 0 .. submitted-1 are in a chunk already
        self.chunks: list[tuple[list[int], Future]] = []

    def on_micro_batch(self, indices: Sequence[int], images: Sequence) -> None:
        """Images ``images`` for rows ``indices`` are decoded; submit every newly completed whole-group prefix."""
        for i, image in zip(indices, images):
            if not 0 <= i < len(self.prompts) or i in self.images:
                raise ValueError(f"image index {i} is out of range or delivered twice")
            self.images[i] = image
        done = self.submitted
        while done in self.images:
            done += 1
        ready = (done // self.group_size) * self.group_size
        if ready > self.submitted:
            sel = list(range(self.submitted, ready))
            self.submitted = ready
            self.chunks.append((sel, self.submit_fn(
                compute_weighted_rewards, self.rewards, [self.images[i] for i in sel], [self.prompts[i] for i in sel],
                [self.metadata[i] for i in sel], self.weights[sel], self.reward_names)))

    def collect(self) -> MultiRewardOutput:
        """Wait for every chunk: scores (N, K) fp32, valid (N, K) bool, info {"per_reward": {name: counters}}."""
        n, k = len(self.prompts), len(self.reward_names)
        if self.submitted != n:
            raise RuntimeError(f"only {self.submitted} of {n} images were delivered as whole groups")
        scores = torch.zeros(n, k)
        valid = torch.zeros(n, k, dtype=torch.bool)
        per_reward: dict[str, dict[str, float]] = {}
        for sel, future in self.chunks:
            out = future.result()
            scores[sel] = out.scores
            valid[sel] = out.valid
            for name, info in out.info.get("per_reward", {}).items():
                acc = per_reward.setdefault(name, {key: 0 if key != "latency_s" else 0.0 for key in COUNTERS})
                for key in acc:
                    acc[key] += info.get(key, 0)
        return MultiRewardOutput(scores=scores, valid=valid, info={"per_reward": per_reward})
