"""Evaluate several rewards on one batch, each only on the samples whose dataset weight for it is non-zero."""
from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Mapping, Sequence

import torch

from .base import MultiRewardOutput, Reward, RewardOutput

logger = logging.getLogger(__name__)


def compute_weighted_rewards(
    rewards: Mapping[str, Reward],
    images: Sequence,
    prompts: Sequence[str],
    metadata: Sequence[dict],
    weights: torch.Tensor,
    reward_names: Sequence[str],
) -> MultiRewardOutput:
    """Scores [N, K] fp32 and valid [N, K] bool for ``reward_names`` (column k) given weights [N, K].

    * Reward k is called only on the samples with ``weights[:, k] != 0``; the others get valid=False, score 0 and
      are counted in ``info["per_reward"][name]["num_skipped"]`` (they carry weight 0 anyway). A reward with no
      weighted sample is not called at all.
    * Different rewards run concurrently (one thread each): rewards are thread-safe by contract.
    * A reward that raises marks all the samples it was asked for valid=False; the error is logged and recorded in
      ``info["per_reward"][name]["error"]``. An exception never becomes a score.
    """
    n, k = len(images), len(reward_names)
    if not (len(prompts) == len(metadata) == n):
        raise ValueError(f"got {n} images, {len(prompts)} prompts, {len(metadata)} metadata entries")
    weights = torch.as_tensor(weights)
    if tuple(weights.shape) != (n, k):
        raise ValueError(f"weights must have shape ({n}, {k}), got {tuple(weights.shape)}")
    if len(set(reward_names)) != k:
        raise ValueError(f"reward_names must be unique, got {list(reward_names)}")
    start = time.perf_counter()
    selected = {name: torch.nonzero(weights[:, j] != 0).flatten().tolist() for j, name in enumerate(reward_names)}
    missing = [name for name, idx in selected.items() if idx and name not in rewards]
    if missing:
        raise KeyError(f"no reward object for weighted reward(s) {missing}; have {sorted(rewards)}")

    def run(name: str, idx: list[int]) -> tuple[RewardOutput | None, Exception | None, float]:
        t0 = time.perf_counter()
        try:
            out = rewards[name]([images[i] for i in idx], [prompts[i] for i in idx], [metadata[i] for i in idx])
            if out.scores.shape != (len(idx),) or out.valid.shape != (len(idx),):
                raise ValueError(f"reward {name!r} returned shape {tuple(out.scores.shape)} for {len(idx)} samples")
            return out, None, time.perf_counter() - t0
        except Exception as exc:  # noqa: BLE001 -- any failure of a reward means "no score", never a fake one
            logger.exception("reward %r failed on %d samples; marking them invalid", name, len(idx))
            return None, exc, time.perf_counter() - t0

    scores = torch.zeros(n, k, dtype=torch.float32)
    valid = torch.zeros(n, k, dtype=torch.bool)
    per_reward: dict[str, dict] = {}
    jobs = {name: idx for name, idx in selected.items() if idx}
    with ThreadPoolExecutor(max_workers=max(1, len(jobs)), thread_name_prefix="reward") as pool:
        futures = {name: pool.submit(run, name, idx) for name, idx in jobs.items()}
        for j, name in enumerate(reward_names):
            idx = selected[name]
            if not idx:
                per_reward[name] = dict(latency_s=0.0, num_scored=0, num_failed=0, num_skipped=n)
                continue
            out, exc, elapsed = futures[name].result()
            if out is None:
                per_reward[name] = dict(latency_s=elapsed, num_scored=0,
                                        num_failed=len(idx), num_skipped=n - len(idx),
                                        error=f"{type(exc).__name__}: {exc}")
                continue
            index = torch.tensor(idx, dtype=torch.long)
            scores[index, j] = out.scores.float()
            valid[index, j] = out.valid
            per_reward[name] = {**out.info, "num_skipped": n - len(idx)}
    scores = torch.where(valid, scores, torch.zeros_like(scores))
    return MultiRewardOutput(scores=scores, valid=valid,
                             info={"per_reward": per_reward, "latency_s": time.perf_counter() - start})
