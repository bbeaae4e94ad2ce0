"""Policy-update losses (docs/training.md#policy-loss-kl-and-the-other-algorithms).

Every loss is computed in fp32; ``mean_D`` = mean over non-batch dims.

- ``clipped_policy_loss``: PPO/GRPO clipped surrogate on per-(image, step) log-probs.
- ``kl_penalty``: KL to the frozen reference DiT ("v-based" / "x-based").
- ``grpo_guard_log_ratio`` + ``grpo_guard_step_weight``: GRPO-Guard's RatioNorm and per-step reweighting.
- ``diffusionnft_loss`` + ``advantages_to_nft_reward``: DiffusionNFT forward-process objective.
- ``sft_flow_matching_loss``: flow-matching MSE for the SFT auxiliary loss.
"""

from __future__ import annotations

import torch

KL_TYPES = ("v-based", "x-based")


def _mean_d(x: torch.Tensor) -> torch.Tensor:
    """(B, ...) -> (B,) mean over all non-batch dims."""
    return x.flatten(1).mean(dim=1)


def clipped_policy_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    clip_range: float | tuple[float, float],
) -> tuple[torch.Tensor, dict]:
    """L = mean[ max(−A·ρ, −A·clip(ρ, 1 − c_low, 1 + c_high)) ],  ρ = exp(log p_θ − log p_old)  (fp32).

    Args:
        log_prob: (M,) log p_θ (differentiable), any dtype (cast to fp32).
        old_log_prob: (M,) log p_old stored in fp32 at rollout (treated as a constant).
        advantages: (M,) A (treated as a constant; broadcastable to log_prob).
        clip_range: c, or (c_low, c_high) meaning ρ is clipped to [1 − c_low, 1 + c_high].

    The mean is over all M elements (one per trained (image, step)), so when ρ ≡ 1 the gradient is −A·∇log p / M.
    stats (detached 0-d fp32 tensors, no host sync):
        clip_fraction: fraction of elements whose gradient the clip removes, (A > 0 ∧ ρ > 1 + c_high) ∨
            (A < 0 ∧ ρ < 1 − c_low); ratio_mean / ratio_min / ratio_max;
        approx_kl: ½·mean[(log p_θ − log p_old)²].
    """
    low, high = (clip_range, clip_range) if isinstance(clip_range, (int, float)) else clip_range
    lp = log_prob.float()
    old = old_log_prob.float().detach()
    adv = advantages.float().detach()
    log_ratio = lp - old
    ratio = torch.exp(log_ratio)
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - low, 1.0 + high)
    loss = torch.maximum(unclipped, clipped).mean()
    with torch.no_grad():
        r = ratio.detach()
        is_clipped = ((adv > 0) & (r > 1.0 + high)) | ((adv < 0) & (r < 1.0 - low))
        stats = {
            "clip_fraction": is_clipped.float().mean(),
            "ratio_mean": r.mean(),
            "ratio_min": r.min(),
            "ratio_max": r.max(),
            "approx_kl": 0.5 * (log_ratio.detach() ** 2).mean(),
        }
    return loss, stats


def _std_view(std, like: torch.Tensor) -> torch.Tensor:
    s = torch.as_tensor(std, dtype=torch.float32, device=like.device)
    if s.ndim == 0:
        s = s.expand(like.shape[0])
    if s.shape != (like.shape[0],):
        raise ValueError(f"std must be a float or a ({like.shape[0]},) tensor, got shape {tuple(s.shape)}")
    if bool((s <= 0).any()):
        raise ValueError("std must be > 0: the KL / ratio scaling is undefined on a deterministic step "
                         "(ode, eta = 0, or the cps step to sigma_next = 0); do not train those steps")
    return s


def kl_penalty(
    kl_type: str,
    *,
    v_theta: torch.Tensor,
    v_ref: torch.Tensor,
    mean_theta: torch.Tensor | None = None,
    mean_ref: torch.Tensor | None = None,
    std=None,
) -> torch.Tensor:
    """Per-sample KL penalty (B,) fp32 against the frozen reference; gradient flows to the θ side only.

    - ``"v-based"``: mean_D[(v_θ − v_ref)²] / (2·std²); with ``std=None``: mean_D[(v_θ − v_ref)²] / 2 (std := 1).
    - ``"x-based"``: mean_D[(μ_θ − μ_ref)²] / (2·std²) — exactly KL(N(μ_θ, std²I) ‖ N(μ_ref, std²I)) / D, the
      per-dimension KL between the two policies' transitions of the same step. ``std`` is required.

    ``std`` is the per-sample transition std of the step, ``SDEStepOutput.std`` (B,) (or a float); it must be > 0
    (ValueError otherwise: deterministic steps have no finite KL scaling and should not be trained).
    Inputs are cast to fp32; ``v_ref`` / ``mean_ref`` are detached.
    """
    if kl_type == "v-based":
        diff2 = _mean_d((v_theta.float() - v_ref.float().detach()) ** 2)
        if std is None:
            return diff2 / 2
    elif kl_type == "x-based":
        if mean_theta is None or mean_ref is None or std is None:
            raise ValueError("x-based KL needs mean_theta, mean_ref and std")
        diff2 = _mean_d((mean_theta.float() - mean_ref.float().detach()) ** 2)
    else:
        raise ValueError(f"unknown kl_type {kl_type!r}; expected one of {KL_TYPES}")
    s = _std_view(std, diff2[:, None])
    return diff2 / (2 * s**2)


def grpo_guard_log_ratio(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    mean: torch.Tensor,
    old_mean: torch.Tensor,
    std,
    *,
    log_prob_form: str = "gaussian",
) -> torch.Tensor:
    """GRPO-Guard's RatioNorm (arXiv 2510.22319): the normalised per-sample log-ratio (B,), derived below.

    With x' = μ_old + std·ξ and the Gaussian form, the per-step log-ratio is
        Δ = log p_θ − log p_old = −mean_D[(μ_θ − μ_old)²]/(2std²) + mean_D[(μ_θ − μ_old)·ξ]/std,
    i.e. a negative mean shift (ρ left of 1) plus a term whose scale 1/std varies strongly across steps.
    RatioNorm removes the shift and rescales by the step's noise scale std = s·√(−Δt):
        ℓ̃ = (Δ + mean_D[(μ_θ − μ_old)²]/(2·std²)) · std   (= mean_D[(μ_θ − μ_old)·ξ], zero-mean over ξ).
    For the squared-error form (log p = −mean_D[(x'−μ)²], i.e. 2std² times the Gaussian Δ):
        ℓ̃ = (Δ + mean_D[(μ_θ − μ_old)²]) / (2·std)   (same ℓ̃).
    Use ρ̃ = exp(ℓ̃) in the clipped surrogate: ``clipped_policy_loss(ℓ̃, zeros, A, c)``, and weight each step's
    loss by :func:`grpo_guard_step_weight`. ``old_mean`` is detached; gradients reach μ_θ through Δ and the
    shift term. std (B,) or float, > 0.
    """
    lp, old = log_prob.float(), old_log_prob.float().detach()
    shift = _mean_d((mean.float() - old_mean.float().detach()) ** 2)
    s = _std_view(std, lp[:, None])
    if log_prob_form == "gaussian":
        return (lp - old + shift / (2 * s**2)) * s
    if log_prob_form == "squared_error":
        return (lp - old + shift) / (2 * s)
    raise ValueError(f"unknown log_prob_form {log_prob_form!r}")


def grpo_guard_step_weight(sigma, sigma_next) -> torch.Tensor:
    """GRPO-Guard gradient reweighting: w = 1/(σ − σ') = 1/(−Δt), fp32 (shape of the inputs).

    The normalised ratio's gradient w.r.t. the velocity scales with |Δt| (∂μ/∂v ∝ Δt); multiplying the step's
    loss by 1/(−Δt) equalises the per-step policy gradient across noise levels.
    """
    sig = torch.as_tensor(sigma, dtype=torch.float32)
    nxt = torch.as_tensor(sigma_next, dtype=torch.float32, device=sig.device)
    dt = sig - nxt
    if bool((dt <= 0).any()):
        raise ValueError("grpo_guard_step_weight needs sigma_next < sigma")
    return 1.0 / dt


def advantages_to_nft_reward(advantages: torch.Tensor, clip_max: float = 5.0) -> torch.Tensor:
    """DiffusionNFT optimality weight r ∈ [0, 1] from advantages: r = ½·clip(A / clip_max, −1, 1) + ½ (fp32)."""
    return 0.5 * torch.clamp(advantages.float() / clip_max, -1.0, 1.0) + 0.5


def diffusionnft_loss(
    v_theta: torch.Tensor,
    v_old: torch.Tensor,
    x0: torch.Tensor,
    noise: torch.Tensor,
    reward_weight: torch.Tensor,
    beta: float,
) -> torch.Tensor:
    """DiffusionNFT objective (arXiv 2509.16117) on the forward process x_σ = (1−σ)x₀ + σ·ε, scalar fp32:

        v⁺ = β·v_θ + (1−β)·v_old,   v⁻ = (1+β)·v_old − β·v_θ,   v* = ε − x₀,
        L = mean_B[ r·mean_D‖v⁺ − v*‖² + (1−r)·mean_D‖v⁻ − v*‖² ].

    v_θ, v_old: (B, ...) velocities at the same x_σ (v_old, the rollout/old policy, is detached).
    reward_weight r: (B,) in [0, 1] (see :func:`advantages_to_nft_reward`). The paper's adaptive per-sample loss
    weighting is not applied here (add it outside if wanted).
    """
    vt, vo = v_theta.float(), v_old.float().detach()
    target = noise.float() - x0.float()
    v_pos = beta * vt + (1 - beta) * vo
    v_neg = (1 + beta) * vo - beta * vt
    r = reward_weight.float().reshape(-1)
    per_sample = r * _mean_d((v_pos - target) ** 2) + (1 - r) * _mean_d((v_neg - target) ** 2)
    return per_sample.mean()


def sft_flow_matching_loss(v_pred: torch.Tensor, noise: torch.Tensor, x0: torch.Tensor) -> torch.Tensor:
    """Flow-matching MSE, scalar fp32: mean over all elements of (v_pred − (ε − x₀))²."""
    return ((v_pred.float() - (noise.float() - x0.float())) ** 2).mean()
