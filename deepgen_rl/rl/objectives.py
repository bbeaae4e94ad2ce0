"""The policy objectives (``--atrain_algorithm``): ONE table, read by the config, the trainer, the docs and the tests.

Each objective is the loss of one *piece* of a GRPO update (a micro-batch of images at one trained timestep j):

``flowgrpo``: clipped surrogate on the recomputed step log-prob (``sde_step(prev_sample=...)``).
``grpoguard``: the same surrogate on GRPO-Guard's normalised log-ratio, weighted by 1/(σ−σ').
``diffusionnft``: the forward-process objective on x_σ = (1−σ)x̂₀ + σε built from the rollout's final latent.
KL to the frozen reference DiT is added (β·KL) when ``beta > 0`` and the objective uses a reference DiT.

The formulas are in :mod:`deepgen_rl.rl.losses` (docs/training.md#policy-loss-kl-and-the-other-algorithms);
this module only wires them to a velocity function. Adding an algorithm: one piece-loss function and one
``Objective`` entry (docs/training.md#an-algorithm).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from deepgen_rl.rl.losses import (advantages_to_nft_reward, clipped_policy_loss, diffusionnft_loss,
                                  grpo_guard_log_ratio, grpo_guard_step_weight, kl_penalty)
from deepgen_rl.rl.samplers import default_log_prob_form, sde_step
from deepgen_rl.utils.seeding import make_generator


@dataclass(frozen=True)
class PieceInputs:
    """What every piece loss of one policy update reads; built once per update (the trainer is never passed).

    ``model`` is the DeepGen (``guided_velocity(model, ...)``); ``transformer`` the TRAINED forward (the DeepSpeed
    engine when there is one: ZeRO-3 accumulates gradients only through it); ``ref_transformer`` the frozen
    reference DiT or None; ``dtype`` the DiT's parameter dtype (latents are cast to it before a forward).
    """

    model: Any
    transformer: Any
    ref_transformer: Any | None
    device: torch.device
    dtype: torch.dtype
    step: int
    rank: int
    seed: int
    algorithm: str
    sampler: str
    eta: float
    cfg_scale: float
    clip_range: float
    beta: float
    kl_type: str
    adv_clip_max: float
    nft_beta: float


@dataclass(frozen=True)
class Piece:
    """One piece of the update: images ``mb`` of the rollout batch at trained step ``j`` (σ = sig → σ' = sig_next).

    ``velocity(x, transformer)`` is the CFG-guided DiT velocity of these images' prompts at σ: x (b, C, h, w) any
    dtype -> (b, C, h, w) in the DiT's dtype. ``adv`` is (b,) fp32 on the device.
    """

    batch: Any  # RolloutBatch
    mb: list[int]
    j: int
    idx: torch.Tensor
    sig: float
    sig_next: float
    adv: torch.Tensor
    velocity: Callable[[torch.Tensor, Any], torch.Tensor]


def _kl_term(inputs: PieceInputs, piece: Piece, x, x_next, v, out, stats: dict):
    """β·KL(π_θ ‖ π_ref) of this piece (0 when β = 0 or there is no reference DiT); records ``stats['kl']``."""
    if not (inputs.beta > 0 and inputs.ref_transformer is not None):
        return 0.0
    with torch.no_grad():
        v_ref = piece.velocity(x, inputs.ref_transformer)
        ref_mean = sde_step(inputs.sampler, v_ref, x, piece.sig, piece.sig_next, inputs.eta, prev_sample=x_next).mean
    kl = kl_penalty(inputs.kl_type, v_theta=v, v_ref=v_ref, mean_theta=out.mean, mean_ref=ref_mean,
                    std=out.std).mean()
    stats["kl"] = kl.detach()
    return inputs.beta * kl


def _surrogate(inputs: PieceInputs, piece: Piece, guard: bool):
    batch, idx, j, dev = piece.batch, piece.idx, piece.j, inputs.device
    x = batch.latents[idx, j].to(dev)
    x_next = batch.latents[idx, j + 1].to(dev)
    old_lp = batch.log_probs[idx, j].to(dev)
    v = piece.velocity(x, inputs.transformer)
    out = sde_step(inputs.sampler, v, x, piece.sig, piece.sig_next, inputs.eta, prev_sample=x_next)
    if guard:
        # One update per rollout (single_update_only): the sampling policy is the current weights before the
        # update, so its transition mean is this forward's mean, detached.
        form = default_log_prob_form(inputs.sampler) or "gaussian"
        log_ratio = grpo_guard_log_ratio(out.log_prob, old_lp, out.mean, out.mean.detach(), out.std,
                                         log_prob_form=form)
        loss, pstats = clipped_policy_loss(log_ratio, torch.zeros_like(log_ratio), piece.adv, inputs.clip_range)
        loss = loss * float(grpo_guard_step_weight(piece.sig, piece.sig_next))
    else:
        loss, pstats = clipped_policy_loss(out.log_prob, old_lp, piece.adv, inputs.clip_range)
    ratio = torch.exp(out.log_prob.detach().float() - old_lp.float())
    stats = {k: v_.detach() for k, v_ in pstats.items()}
    stats["policy_loss"] = loss.detach()
    stats["ratio_max_abs_dev"] = (ratio - 1).abs().max()
    loss = loss + _kl_term(inputs, piece, x, x_next, v, out, stats)
    return loss, stats


def flowgrpo_piece_loss(inputs: PieceInputs, piece: Piece):
    """Clipped surrogate on exp(log π_θ(x'|x) − log π_old(x'|x)) (+ β·KL). Returns (loss, stats of 0-dim tensors)."""
    return _surrogate(inputs, piece, guard=False)


def grpoguard_piece_loss(inputs: PieceInputs, piece: Piece):
    """GRPO-Guard: the surrogate on the normalised log-ratio, times 1/(σ−σ') (+ β·KL)."""
    return _surrogate(inputs, piece, guard=True)


def diffusionnft_piece_loss(inputs: PieceInputs, piece: Piece):
    """DiffusionNFT on x_σ = (1−σ)x̂₀ + σε, ε from ``make_generator("nft", seed, step, rank, j, mb[0])``."""
    dev, sig = inputs.device, piece.sig
    x0 = piece.batch.latents[piece.idx, -1].to(dev)
    gen = make_generator("nft", inputs.seed, inputs.step, inputs.rank, piece.j, piece.mb[0])
    noise = torch.randn(x0.shape, generator=gen).to(dev)
    x_sigma = (1 - sig) * x0 + sig * noise
    v = piece.velocity(x_sigma, inputs.transformer)
    # one optimizer update per rollout: the old (sampling) policy is the current weights before the update
    loss = diffusionnft_loss(v, v.detach(), x0, noise, advantages_to_nft_reward(piece.adv, inputs.adv_clip_max),
                             inputs.nft_beta)
    return loss, {"policy_loss": loss.detach(), "ratio_max_abs_dev": torch.zeros(())}


@dataclass(frozen=True)
class Objective:
    """One ``--atrain_algorithm``: its piece loss and the two facts the config and the trainer need.

    ``uses_reference_dit``: the trainer builds the frozen reference DiT for β·KL (when ``--beta > 0``).
    ``single_update_only``: the old-policy terms come from the weights that sampled the rollout, so the config
    requires ``--atrain_num_actor_update_steps 1``.
    """

    name: str
    piece_loss: Callable[[PieceInputs, Piece], tuple[torch.Tensor, dict]]
    uses_reference_dit: bool
    single_update_only: bool


OBJECTIVES: dict[str, Objective] = {o.name: o for o in (
    Objective("flowgrpo", flowgrpo_piece_loss, uses_reference_dit=True, single_update_only=False),
    Objective("grpoguard", grpoguard_piece_loss, uses_reference_dit=True, single_update_only=True),
    Objective("diffusionnft", diffusionnft_piece_loss, uses_reference_dit=False, single_update_only=True),
)}
OBJECTIVE_NAMES = tuple(OBJECTIVES)
