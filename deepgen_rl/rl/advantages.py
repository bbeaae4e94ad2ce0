"""Group-relative advantages for multi-reward GRPO (docs/training.md#advantages).

Inputs describe the GLOBAL batch (gathered across ranks): N images, K rewards.
``rewards[i, k]`` = r, ``weights[i, k]`` = w (dataset reward weights; 0 = reward k not used for image i),
``group_ids[i]`` = prompt group, ``valid[i, k]`` = reward k was actually computed for image i.

Missing rewards. Entry (i, k) is *present* if w ≠ 0 and valid, *missing* if w ≠ 0 and not valid (a failed reward);
entries with w = 0 play no role. A missing value never enters any statistic and contributes 0 to its image's
advantage; nothing is imputed.

- ``"grpo"``: R_i = Σ_k w_ik·r_ik is only defined for *complete* images (no missing entry, ≥ 1 present).
  Group mean and unbiased std of R are taken over the complete members of the group:
  A_i = (R_i − mean_g R) / (std_g R + ε).
  An image with a missing reward uses the same statistics on its present terms only:
  A_i = (Σ_{k present} w_ik·r_ik − Σ_{k present} mean_{j∈g complete}[w_jk·r_jk]) / (std_g R + ε),
  i.e. the missing term's (r − baseline) is 0. (For a complete image this is exactly (R_i − mean_g R).)
- ``"grpo_global_std"``: as grpo, but the std is the unbiased std of R over all complete images of the batch.
- ``"reinforcepp"``: as grpo with mean and std over all complete images of the batch (one "group").
- ``"gdpo"``: per reward k, Â_ik = (r_ik − mean_g r_k) / (std_g r_k + ε) with mean/std over the group members
  where (·, k) is present; Â_ik = 0 when (i, k) is not present. C_i = Σ_k w_ik·Â_ik;
  A_i = (C_i − mean C) / (std C + ε) with mean/std over all images that have ≥ 1 present reward.

Degenerate statistics: a statistic set (a group's R, a group's reward k, the batch) with fewer than 2 members or
all members exactly equal contributes advantage 0 to its members' term (not ±0/ε noise, and no NaN from a
1-element unbiased std). Images without any present weighted reward get A = 0 and are counted in
``stats["num_no_valid_reward"]``. Finally A is clamped to [−clip_max, clip_max].
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

# Each advantage type and where its baseline (mean) is taken: "group" = the prompt group, "batch" = the whole batch
# (one group). The one list: config, tests and docs import ADV_TYPES.
BASELINE_SCOPE = {"grpo": "group", "grpo_global_std": "group", "reinforcepp": "batch", "gdpo": "group"}
ADV_TYPES = tuple(BASELINE_SCOPE)
GROUP_BASELINE_ADV_TYPES = tuple(t for t in ADV_TYPES if BASELINE_SCOPE[t] == "group")


@dataclass
class AdvantageOutput:
    """advantages: fp32 (N,) on the rewards' device. stats: python floats/ints (see ``compute_advantages``)."""

    advantages: torch.Tensor
    stats: dict = field(default_factory=dict)


@dataclass
class _SegmentStats:
    mean: torch.Tensor  # (S,)
    std: torch.Tensor  # (S,) unbiased; 0 where count < 2
    count: torch.Tensor  # (S,)
    degenerate: torch.Tensor  # (S,) bool: count < 2 or all members equal


def _segment_stats(values: torch.Tensor, member: torch.Tensor, index: torch.Tensor, num: int) -> _SegmentStats:
    """Mean / unbiased std / equality of ``values`` over the ``member`` entries of each segment ``index``."""
    zeros = torch.zeros(num, dtype=values.dtype, device=values.device)
    vals = torch.where(member, values, torch.zeros_like(values))
    count = zeros.index_add(0, index, member.to(values.dtype))
    mean = zeros.index_add(0, index, vals) / count.clamp_min(1)
    dev2 = torch.where(member, (vals - mean[index]) ** 2, torch.zeros_like(values))
    std = torch.sqrt(zeros.index_add(0, index, dev2) / (count - 1).clamp_min(1))
    inf = torch.full_like(values, float("inf"))
    vmax = torch.full_like(zeros, -float("inf")).scatter_reduce(0, index, torch.where(member, values, -inf), "amax")
    vmin = torch.full_like(zeros, float("inf")).scatter_reduce(0, index, torch.where(member, values, inf), "amin")
    degenerate = (count < 2) | (vmax == vmin)
    return _SegmentStats(mean=mean, std=torch.where(count < 2, torch.zeros_like(std), std), count=count,
                         degenerate=degenerate)


def _normalise(numerator: torch.Tensor, std: torch.Tensor, ok: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.where(ok, numerator / (std + eps), torch.zeros_like(numerator))


def compute_advantages(
    adv_type: str,
    rewards: torch.Tensor,
    weights: torch.Tensor,
    group_ids: torch.Tensor,
    valid: torch.Tensor | None = None,
    eps: float = 1e-4,
    clip_max: float = 5.0,
) -> AdvantageOutput:
    """Advantages A (N,) for ``adv_type`` in {"grpo", "grpo_global_std", "reinforcepp", "gdpo"} (formulas and the
    treatment of missing rewards in the module docstring).

    Args:
        rewards: (N, K) float (values where not present are ignored, NaN allowed there).
        weights: (N, K) float reward weights (broadcastable to (N, K)).
        group_ids: (N,) int prompt-group id of each image (any integers).
        valid: (N, K) bool, None = all valid.
        eps: ε added to every std. clip_max: final clamp of A.

    Statistics are computed in float64. ``stats``:
        zero_std_group_fraction: fraction of statistic sets with ≥ 1 member that are degenerate (groups for
            grpo/grpo_global_std, (group, reward) pairs for gdpo, the batch for reinforcepp),
        clamp_fraction: fraction of images with a valid reward whose |A| exceeded clip_max before clamping,
        advantage_mean / advantage_std: over images with a valid reward, after clamping,
        num_no_valid_reward: images without any present weighted reward (A = 0),
        num_partial_reward: images with some but not all weighted rewards present.
    """
    if adv_type not in ADV_TYPES:
        raise ValueError(f"unknown adv_type {adv_type!r}; expected one of {ADV_TYPES}")
    if rewards.ndim == 1:
        rewards = rewards[:, None]
    n, k = rewards.shape
    device = rewards.device
    r = rewards.to(torch.float64)
    w = torch.as_tensor(weights, device=device).to(torch.float64).broadcast_to(n, k)
    v = torch.ones(n, k, dtype=torch.bool, device=device) if valid is None else valid.to(device).bool().reshape(n, k)
    if group_ids.shape != (n,):
        raise ValueError(f"group_ids must have shape ({n},), got {tuple(group_ids.shape)}")
    _, g = torch.unique(group_ids.to(device), return_inverse=True)
    num_groups = int(g.max().item()) + 1 if n else 0

    used = w != 0
    present = used & v
    missing = used & ~v
    has_valid = present.any(dim=1)
    wr = torch.where(present, w * torch.where(present, r, torch.zeros_like(r)), torch.zeros_like(r))

    if adv_type == "gdpo":
        flat_index = (g[:, None] * k + torch.arange(k, device=device)[None, :]).reshape(-1)
        per_reward = _segment_stats(torch.where(present, r, torch.zeros_like(r)).reshape(-1), present.reshape(-1),
                                    flat_index, num_groups * k)
        ok = present.reshape(-1) & ~per_reward.degenerate[flat_index]
        a_hat = _normalise(r.reshape(-1) - per_reward.mean[flat_index], per_reward.std[flat_index], ok, eps)
        combined = (w * a_hat.reshape(n, k)).sum(dim=1)
        batch = _segment_stats(combined, has_valid, torch.zeros_like(g), 1)
        adv = _normalise(combined - batch.mean[0], batch.std[0].expand(n), has_valid & ~batch.degenerate[0], eps)
        considered = per_reward.count > 0
        zero_std_fraction = per_reward.degenerate[considered].double().mean() if considered.any() else None
    else:
        complete = has_valid & ~missing.any(dim=1)
        total = wr.sum(dim=1)
        if BASELINE_SCOPE[adv_type] == "batch":
            seg, num_seg = torch.zeros_like(g), 1
        else:
            seg, num_seg = g, num_groups
        # Per-(segment, reward) mean of w·r over complete members; an image's baseline sums only its non-missing
        # terms, so for complete images baseline == mean of R over the segment.
        count = torch.zeros(num_seg, dtype=r.dtype, device=device).index_add(0, seg, complete.to(r.dtype))
        term_sum = torch.zeros(num_seg, k, dtype=r.dtype, device=device).index_add(
            0, seg, torch.where(complete[:, None], wr, torch.zeros_like(wr)))
        term_mean = term_sum / count.clamp_min(1)[:, None]
        baseline = torch.where(missing, torch.zeros_like(wr), term_mean[seg]).sum(dim=1)
        seg_stats = _segment_stats(total, complete, seg, num_seg)
        ok = has_valid & ~seg_stats.degenerate[seg]
        if adv_type == "grpo_global_std":
            batch = _segment_stats(total, complete, torch.zeros_like(g), 1)
            std = batch.std[0].expand(n)
            ok = ok & ~batch.degenerate[0]
        else:
            std = seg_stats.std[seg]
        adv = _normalise(total - baseline, std, ok, eps)
        considered = seg_stats.count > 0
        zero_std_fraction = seg_stats.degenerate[considered].double().mean() if considered.any() else None

    clamped = adv.abs() > clip_max
    adv = adv.clamp(-clip_max, clip_max)
    num_valid = int(has_valid.sum().item())
    adv_valid = adv[has_valid]
    stats = {
        "zero_std_group_fraction": float(zero_std_fraction) if zero_std_fraction is not None else 0.0,
        "clamp_fraction": float(clamped[has_valid].double().mean()) if num_valid else 0.0,
        "advantage_mean": float(adv_valid.mean()) if num_valid else 0.0,
        "advantage_std": float(adv_valid.std()) if num_valid > 1 else 0.0,
        "num_no_valid_reward": int(n - num_valid),
        "num_partial_reward": int((has_valid & missing.any(dim=1)).sum().item()),
    }
    return AdvantageOutput(advantages=adv.to(torch.float32), stats=stats)
