"""One denoising step of a rectified-flow model, deterministic or stochastic, with its fp32 log-probability.

Conventions (docs/training.md#samplers-and-log-probabilities): σ ∈ [0, 1], σ = 1 is pure noise,
x_σ = (1−σ)·x₀ + σ·ε and the model predicts v ≈ ε − x₀. A step goes from σ to σ' < σ, Δt = σ' − σ < 0. From the velocity:
x̂₀ = x − σ·v (predicted clean latent), x̂₁ = x + (1−σ)·v (predicted noise). ``mean_D`` = mean over all non-batch dims.

Samplers (``sde_step(sampler, ...)``):

- ``"ode"``          Euler: x' = x + Δt·v; std = 0; log_prob = 0.
- ``"flowgrpo_sde"`` Flow-GRPO (arXiv 2505.05470): s = η·√(σ / (1 − σ̃)), σ̃ = σ except σ̃ = σ' when σ = 1;
                     μ = x + [v + s²/(2σ)·x̂₁]·Δt; std = s·√(−Δt); x' = μ + std·ξ.
- ``"cps_sde"``      Coefficients-Preserving Sampling (arXiv 2509.05952): s = σ'·sin(ηπ/2);
                     μ = (1−σ')·x̂₀ + √(σ'² − s²)·x̂₁; std = s; x' = μ + s·ξ.
                     Computed as μ = (x + Δt·v) + (√(σ'² − s²) − σ')·x̂₁ (algebraically identical), so η = 0 is
                     bit-for-bit the Euler step and η = 1 drops the x̂₁ term exactly.
- ``"dance_sde"``    DanceGRPO (arXiv 2505.07818): s = η; μ = x + [v + η²/(2σ)·x̂₁]·Δt; std = η·√(−Δt).

Log-probability forms (``log_prob_form``), always fp32 and averaged (not summed) over D = C·H·W:

- ``"gaussian"``       log p = mean_D[ −(x'−μ)²/(2·std²) − log std − ½·log 2π ]   (default for flowgrpo/dance)
- ``"squared_error"``  log p = −mean_D[ (x'−μ)² ]                                  (default for cps_sde)

The squared-error form is the CPS / peer convention (constants and the 1/(2s²) factor dropped); the seed's
clip_range = 1e-4 was tuned for it. PPO clip ranges are therefore not portable between forms.
Deterministic steps (std = 0: ode, η = 0, or the cps step to σ' = 0): the Gaussian form is defined as 0 there (the
step carries no likelihood); the squared-error form does not involve std and stays −mean_D[(x'−μ)²] (0 for a
sampled x').
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch

SAMPLERS = ("ode", "flowgrpo_sde", "cps_sde", "dance_sde")  # the one list: config, tests and docs import it
ODE = SAMPLERS[0]  # the deterministic Euler step (evaluation, steps outside the SDE window)
SDE_SAMPLERS = tuple(s for s in SAMPLERS if s != ODE)  # the stochastic ones: what training can score
DEFAULT_SDE_SAMPLER = "cps_sde"  # the recipe's (docs/recipe.md)
DEFAULT_SDE_ETA = 1.0  # the recipe's noise level (docs/recipe.md)
LOG_PROB_FORMS = ("gaussian", "squared_error")
_DEFAULT_LOG_PROB_FORM = {"flowgrpo_sde": "gaussian", "cps_sde": "squared_error", "dance_sde": "gaussian"}
_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


@dataclass
class SDEStepOutput:
    """Result of one step. All tensors fp32.

    prev_sample: (B, ...) x' (sampled, detached; or the ``prev_sample`` that was given, cast to fp32).
    mean:        (B, ...) μ, the mean of the transition (differentiable w.r.t. velocity).
    std:         (B,) per-sample transition standard deviation (0 for deterministic steps).
    log_prob:    (B,) log-probability of prev_sample under N(μ, std²) in the chosen form, mean over non-batch dims.
    """

    prev_sample: torch.Tensor
    mean: torch.Tensor
    std: torch.Tensor
    log_prob: torch.Tensor


def _as_batch_sigma(sigma, batch: int, device: torch.device) -> torch.Tensor:
    """float | 0-d | (B,) tensor -> fp32 (B,) tensor on ``device``."""
    s = torch.as_tensor(sigma, dtype=torch.float32, device=device)
    if s.ndim == 0:
        return s.expand(batch)
    if s.shape != (batch,):
        raise ValueError(f"sigma must be a float or a ({batch},) tensor, got shape {tuple(s.shape)}")
    return s


def _check_float_sigmas(sigma: float, sigma_next: float) -> None:
    """The check of :func:`_check_sigmas` on Python floats: no tensor, so no host-device synchronisation."""
    if not 0.0 <= sigma_next < sigma <= 1.0:
        raise ValueError(f"sde_step needs 0 <= sigma_next < sigma <= 1 (got sigma={sigma}, sigma_next={sigma_next})")


def _check_sigmas(sigma: torch.Tensor, sigma_next: torch.Tensor) -> None:
    bad = (sigma > 1) | (sigma <= 0) | (sigma_next < 0) | (sigma_next >= sigma)
    if bool(bad.any()):
        raise ValueError(
            "sde_step needs 0 <= sigma_next < sigma <= 1 for every sample "
            f"(got sigma={sigma.tolist()}, sigma_next={sigma_next.tolist()})"
        )


def _gaussian_log_prob(x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """mean_D[−(x−μ)²/(2std²) − log std − ½log2π] per sample; 0 where std == 0. std is (B,)."""
    deterministic = std <= 0
    safe_std = torch.where(deterministic, torch.ones_like(std), std)
    s = safe_std.view(-1, *([1] * (x.ndim - 1)))
    lp = -((x - mean) ** 2) / (2 * s**2) - torch.log(s) - _HALF_LOG_2PI
    lp = lp.flatten(1).mean(dim=1)
    return torch.where(deterministic, torch.zeros_like(lp), lp)


def _squared_error_log_prob(x: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
    return -((x - mean) ** 2).flatten(1).mean(dim=1)


def sde_step(
    sampler: str,
    velocity: torch.Tensor,
    latents: torch.Tensor,
    sigma,
    sigma_next,
    eta: float,
    *,
    prev_sample: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    log_prob_form: str | None = None,
) -> SDEStepOutput:
    """Take (or score) one step σ → σ' with ``sampler`` (see the module docstring for every formula).

    Args:
        sampler: one of ``"ode"``, ``"flowgrpo_sde"``, ``"cps_sde"``, ``"dance_sde"``.
        velocity: (B, C, H, W) (any dtype) model output v at (latents, sigma).
        latents: (B, C, H, W) (any dtype) x_σ.
        sigma, sigma_next: floats or (B,) tensors with 0 <= σ' < σ <= 1 (ValueError otherwise: a step from σ = 0
            or a non-decreasing step has no meaning here, and the divisions by σ and 1 − σ̃ stay finite). Pass
            floats on the GPU hot path: they are checked on the host; tensors are checked with one device sync.
        eta: noise level η (flowgrpo: multiplier of √(σ/(1−σ̃)); cps: fraction of the ``π/2`` angle, in [0, 1];
            dance: the constant s). Ignored by ``"ode"``.
        prev_sample: if given, this x' is scored instead of sampled (training recomputes log-probs this way);
            gradients flow from ``log_prob`` to ``velocity`` through μ.
        generator: torch.Generator for ξ ~ N(0, I) (on the latents' device); reproducible sampling.
        log_prob_form: ``"gaussian"`` or ``"squared_error"``; None = the sampler's default (gaussian for
            flowgrpo/dance, squared_error for cps).

    All math is done in fp32 whatever the input dtype (velocity, latents and prev_sample are cast first).
    """
    if sampler not in SAMPLERS:
        raise ValueError(f"unknown sampler {sampler!r}; expected one of {SAMPLERS}")
    if velocity.shape != latents.shape:
        raise ValueError(f"velocity {tuple(velocity.shape)} and latents {tuple(latents.shape)} differ in shape")
    check_eta(sampler, eta)
    v = velocity.float()
    x = latents.float()
    batch, device = x.shape[0], x.device
    floats = isinstance(sigma, (int, float)) and isinstance(sigma_next, (int, float))
    if floats:  # the hot path (rollout, training): validate before the values become device tensors
        _check_float_sigmas(float(sigma), float(sigma_next))
    sig = _as_batch_sigma(sigma, batch, device)
    sig_next = _as_batch_sigma(sigma_next, batch, device)
    if not floats:  # tensors: bool() of a device tensor waits for the device
        _check_sigmas(sig, sig_next)
    view = (-1,) + (1,) * (x.ndim - 1)
    dt = (sig_next - sig).view(view)
    sig_b, sig_next_b = sig.view(view), sig_next.view(view)

    if sampler == "ode":
        mean = x + dt * v
        std = torch.zeros(batch, dtype=torch.float32, device=device)
    elif sampler in ("flowgrpo_sde", "dance_sde"):
        if sampler == "flowgrpo_sde":
            # σ̃ = σ' at σ = 1 keeps √(σ/(1−σ̃)) finite on the first step (Flow-GRPO uses the second sigma).
            sig_tilde = torch.where(sig >= 1, sig_next, sig)
            s = eta * torch.sqrt(sig / (1 - sig_tilde))
        else:
            s = torch.full_like(sig, float(eta))
        s_b = s.view(view)
        x1_hat = x + (1 - sig_b) * v
        mean = x + (v + s_b**2 / (2 * sig_b) * x1_hat) * dt
        std = s * torch.sqrt(sig - sig_next)
    else:  # cps_sde
        s = sig_next * math.sin(eta * math.pi / 2)
        s_b = s.view(view)
        x1_coef = torch.sqrt(torch.clamp(sig_next_b**2 - s_b**2, min=0.0))
        x1_hat = x + (1 - sig_b) * v
        # (1−σ')x̂₀ + σ'x̂₁ == x + Δt·v, so μ = Euler + (√(σ'²−s²) − σ')·x̂₁; the bracket is exactly 0 for η = 0.
        mean = (x + dt * v) + (x1_coef - sig_next_b) * x1_hat
        std = s

    if prev_sample is None:
        if sampler == "ode":
            prev = mean.detach()
        else:
            noise = torch.randn(x.shape, generator=generator, device=device, dtype=torch.float32)
            prev = (mean + std.view(view) * noise).detach()
    else:
        if prev_sample.shape != x.shape:
            raise ValueError(f"prev_sample {tuple(prev_sample.shape)} does not match latents {tuple(x.shape)}")
        prev = prev_sample.float()

    if sampler == "ode":
        log_prob = torch.zeros(batch, dtype=torch.float32, device=device)
    else:
        form = log_prob_form or _DEFAULT_LOG_PROB_FORM[sampler]
        if form == "gaussian":
            log_prob = _gaussian_log_prob(prev, mean, std)
        elif form == "squared_error":
            log_prob = _squared_error_log_prob(prev, mean)
        else:
            raise ValueError(f"unknown log_prob_form {form!r}; expected one of {LOG_PROB_FORMS}")
    return SDEStepOutput(prev_sample=prev, mean=mean, std=std, log_prob=log_prob)


def check_eta(sampler: str, eta: float) -> None:
    """eta must be a finite number >= 0 (a negative eta would give a negative std), and <= 1 for cps_sde
    (s = σ'·sin(ηπ/2) is only monotone on [0, 1]; η = 1 already re-noises fully)."""
    if sampler == "ode":
        return
    if not math.isfinite(float(eta)) or eta < 0:
        raise ValueError(f"{sampler}: eta must be a finite number >= 0, got {eta}")
    if sampler == "cps_sde" and eta > 1:
        raise ValueError(f"cps_sde: eta must be in [0, 1] (s = sigma_next * sin(eta * pi / 2)), got {eta}")


def default_log_prob_form(sampler: str) -> str | None:
    """The log-prob form ``sde_step`` uses for ``sampler`` when ``log_prob_form`` is None (None for ``"ode"``)."""
    return _DEFAULT_LOG_PROB_FORM.get(sampler)


# ----------------------------------------------------------------------------------------------------------------
# Sigma schedule
# ----------------------------------------------------------------------------------------------------------------


def _shift(s, shift: float):
    return shift * s / (1 + (shift - 1) * s)


def make_sigmas(
    num_inference_steps: int, shift: float, device: torch.device | str | None = None, num_train_timesteps: int = 1000
) -> torch.Tensor:
    """fp32 tensor [T+1] of sigmas from 1 down to 0, equal to diffusers
    ``FlowMatchEulerDiscreteScheduler(shift=shift, num_train_timesteps=1000).set_timesteps(T).sigmas`` (no dynamic
    shifting, no karras/exponential/beta schedules, no terminal stretch).

    diffusers: σ_min = shift(1/N) (computed in fp32 at construction); t = linspace(N, N·σ_min, T);
    σ = shift(t/N) with shift(s) = k·s/(1 + (k−1)·s); then a final 0 is appended. (Yes, σ_min is shifted twice —
    that is what the scheduler does, and the model was sampled that way.)
    """
    if num_inference_steps < 1:
        raise ValueError("num_inference_steps must be >= 1")
    n = num_train_timesteps
    sigma_min = float(_shift(torch.tensor(1.0, dtype=torch.float32) / n, float(shift)))
    t = torch.linspace(1.0 * n, sigma_min * n, num_inference_steps, dtype=torch.float64)
    sigmas = _shift(t / n, float(shift)).to(torch.float32)
    sigmas = torch.cat([sigmas, torch.zeros(1, dtype=torch.float32)])
    return sigmas.to(device) if device is not None else sigmas


# ----------------------------------------------------------------------------------------------------------------
# Which steps are stochastic / trained
# ----------------------------------------------------------------------------------------------------------------


def sde_window(
    num_steps: int,
    window_size: int,
    window_range: Sequence[int] | None = None,
    generator: torch.Generator | None = None,
) -> tuple[int, int] | None:
    """Draw the SDE window (Flow-GRPO-Fast / MixGRPO): a half-open range [start, start + window_size) of step indices.

    ``window_range = (lo, hi)`` (half-open, default ``(0, num_steps − 1)``, i.e. never the last step) bounds the
    window: start is uniform over {lo, …, hi − window_size}, drawn with ``generator`` (a CPU torch.Generator; seed it
    identically on every rank so all ranks share the window). ``generator=None`` gives the deterministic start ``lo``.
    ``window_size <= 0`` returns None (no window: every step is stochastic).
    """
    if window_size <= 0:
        return None
    lo, hi = (0, num_steps - 1) if window_range is None else (int(window_range[0]), int(window_range[1]))
    if not (0 <= lo and hi <= num_steps and hi - lo >= window_size):
        raise ValueError(f"window of {window_size} steps does not fit in range [{lo}, {hi}) of {num_steps} steps")
    if generator is None:
        start = lo
    else:
        start = lo + int(torch.randint(0, hi - window_size - lo + 1, (1,), generator=generator).item())
    return start, start + window_size


def stochastic_step_mask(num_steps: int, window: tuple[int, int] | None) -> list[bool]:
    """Per step index: True = use the SDE sampler, False = ODE (Euler). ``window=None`` -> all True."""
    if window is None:
        return [True] * num_steps
    start, end = window
    return [start <= j < end for j in range(num_steps)]


def trained_step_indices(
    num_steps: int,
    *,
    timestep_fraction: float | None = None,
    window: tuple[int, int] | None = None,
    generator: torch.Generator | None = None,
) -> list[int]:
    """Sorted step indices j (step j goes sigmas[j] → sigmas[j+1]) whose log-probs are trained.

    - ``window`` given (from :func:`sde_window`): exactly the window's steps (the stochastic ones).
      ``timestep_fraction`` must then be None.
    - else ``timestep_fraction`` f: k = min(int(f·num_steps), num_steps − 1) steps among 0 … num_steps − 2 (the
      last step is never trained). ``generator=None``: the first k steps (Flow-GRPO); with a generator: k steps
      drawn uniformly without replacement.
    - neither: all steps except the last.
    """
    if window is not None:
        if timestep_fraction is not None:
            raise ValueError("pass either window or timestep_fraction, not both")
        start, end = window
        if not (0 <= start < end <= num_steps):
            raise ValueError(f"window {window} outside 0..{num_steps}")
        return list(range(start, end))
    candidates = num_steps - 1
    if timestep_fraction is None:
        return list(range(candidates))
    if not 0.0 < timestep_fraction <= 1.0:
        raise ValueError(f"timestep_fraction must be in (0, 1], got {timestep_fraction}")
    k = min(int(timestep_fraction * num_steps), candidates)
    if generator is None:
        return list(range(k))
    return sorted(torch.randperm(candidates, generator=generator)[:k].tolist())
