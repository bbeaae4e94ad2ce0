"""The per-(micro-batch, timestep) policy loss of one GRPO update, shared by every algorithm option.

``flowgrpo``: clipped surrogate on the recomputed step log-prob (``sde_step(prev_sample=...)``).
``grpoguard``: the same surrogate on GRPO-Guard's normalised log-ratio, weighted by 1/(σ−σ').
``diffusionnft``: the forward-process objective on x_σ = (1−σ)x̂₀ + σε built from the rollout's final latent.
KL to the frozen reference DiT is added (β·KL) when ``beta > 0``.
"""

from __future__ import annotations

import torch

from deepgen_rl.rl.losses import (advantages_to_nft_reward, clipped_policy_loss, diffusionnft_loss,
                                  grpo_guard_log_ratio, grpo_guard_step_weight, kl_penalty)
from deepgen_rl.rl.samplers import default_log_prob_form, sde_step
from deepgen_rl.rollout import guided_velocity
from deepgen_rl.utils.seeding import make_generator


def policy_piece_loss(trainer, batch, advantages: torch.Tensor, mb: list[int], j: int):
    """Loss (scalar, differentiable w.r.t. the DiT) and float stats for images ``mb`` at step ``j``.

    The stats are computed as device tensors and copied to the host in one transfer at the end.
    """
    args, model = trainer.args, trainer.deepgen
    dev = trainer.device
    dit = trainer.dit_module
    dtype = next(dit.parameters()).dtype
    idx = torch.tensor(mb, dtype=torch.long)
    cond = batch.cond.index_select(batch.cond_index[idx].to(dev))
    sig, sig_next = float(batch.sigmas[j]), float(batch.sigmas[j + 1])
    adv = advantages[idx].to(dev)
    b = len(mb)

    def velocity(x, transformer):
        sigma = torch.full((b,), sig, device=dev)
        return guided_velocity(model, x.to(dtype), sigma, cond, batch.uncond, args.cfg_scale, transformer)

    stats: dict[str, float] = {}
    if args.atrain_algorithm == "diffusionnft":
        x0 = batch.latents[idx, -1].to(dev)
        gen = make_generator("nft", args.seed, trainer.state.global_step, trainer.rank, j, mb[0])
        noise = torch.randn(x0.shape, generator=gen).to(dev)
        x_sigma = (1 - sig) * x0 + sig * noise
        v = velocity(x_sigma, trainer.dit_forward)
        # one optimizer update per rollout: the old (sampling) policy is the current weights before the update
        loss = diffusionnft_loss(v, v.detach(), x0, noise, advantages_to_nft_reward(adv, args.adv_clip_max),
                                 args.diffusionnft_beta)
        stats["policy_loss"] = loss.detach()
        ratio_dev = torch.zeros(())
    else:
        x = batch.latents[idx, j].to(dev)
        x_next = batch.latents[idx, j + 1].to(dev)
        old_lp = batch.log_probs[idx, j].to(dev)
        v = velocity(x, trainer.dit_forward)  # the engine under DeepSpeed (ZeRO-3 accumulates only through it)
        out = sde_step(args.atrain_sde_sampler, v, x, sig, sig_next, args.sde_eta, prev_sample=x_next)
        if args.atrain_algorithm == "grpoguard":
            # One update per rollout (enforced in GRPOConfig): the sampling policy is the current weights before
            # the update, so its transition mean is this forward's mean, detached.
            old_mean = out.mean.detach()
            form = default_log_prob_form(args.atrain_sde_sampler) or "gaussian"
            log_ratio = grpo_guard_log_ratio(out.log_prob, old_lp, out.mean, old_mean, out.std, log_prob_form=form)
            loss, pstats = clipped_policy_loss(log_ratio, torch.zeros_like(log_ratio), adv, args.clip_range)
            loss = loss * float(grpo_guard_step_weight(sig, sig_next))
            ratio = torch.exp(out.log_prob.detach().float() - old_lp.float())
        else:
            loss, pstats = clipped_policy_loss(out.log_prob, old_lp, adv, args.clip_range)
            ratio = torch.exp(out.log_prob.detach().float() - old_lp.float())
        stats.update({k: v_.detach() for k, v_ in pstats.items()})
        stats["policy_loss"] = loss.detach()
        ratio_dev = (ratio - 1).abs().max()
        if args.beta > 0 and trainer.ref_dit is not None:
            with torch.no_grad():
                v_ref = velocity(x, trainer.ref_dit)
                ref_mean = sde_step(args.atrain_sde_sampler, v_ref, x, sig, sig_next, args.sde_eta,
                                    prev_sample=x_next).mean
            kl = kl_penalty(args.atrain_kl_type, v_theta=v, v_ref=v_ref, mean_theta=out.mean, mean_ref=ref_mean,
                            std=out.std).mean()
            loss = loss + args.beta * kl
            stats["kl"] = kl.detach()
    stats["ratio_max_abs_dev"] = ratio_dev
    # ONE host copy for all the piece's statistics (each float() of a device tensor would wait for the device)
    values = torch.stack([torch.as_tensor(v_).float().reshape(()).to(dev) for v_ in stats.values()]).tolist()
    return loss, dict(zip(stats, values))
