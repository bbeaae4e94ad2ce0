"""The objective table: every ``--atrain_algorithm`` is one entry, and each entry keeps the properties the trainer
relies on. Parametrised over the table itself, so a new objective is tested without editing this file.

No DeepGen: the "model" is a linear velocity field v = W·x + c (a 1x1 conv plus the prompt's pooled vector), the
trajectory is sampled with the same field, so before any update the policy IS the rollout policy.
"""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch

from deepgen_rl.config import GRPOConfig
from deepgen_rl.models.deepgen.conditioning import Conditioning
from deepgen_rl.rl.objectives import OBJECTIVE_NAMES, OBJECTIVES, PieceInputs
from deepgen_rl.rl.samplers import make_sigmas, sde_step
from deepgen_rl.trainer.policy import policy_piece_loss

C, H, W, T, N = 4, 4, 4, 3, 4
SAMPLER, ETA = "flowgrpo_sde", 0.7


class LinearModel:
    """``predict_velocity`` of a DeepGen-like model: v = conv1x1(x) + pooled[:, :C] (per image)."""

    def predict_velocity(self, latents, sigma, cond, transformer=None):
        return transformer(latents) + cond.pooled_embeds[:, :C, None, None].to(latents.dtype)


def _setup(seed=0):
    g = torch.Generator().manual_seed(seed)
    dit = torch.nn.Conv2d(C, C, 1)
    with torch.no_grad():
        dit.weight.copy_(0.1 * torch.randn(dit.weight.shape, generator=g))
        dit.bias.zero_()
    pooled = torch.randn(2, C, generator=g)
    cond = Conditioning(prompt_embeds=pooled[:, None, :].repeat(1, 2, 1), pooled_embeds=pooled)
    cond_index = torch.tensor([0, 0, 1, 1])
    sigmas = make_sigmas(T, 3.0)
    latents = torch.empty(N, T + 1, C, H, W)
    log_probs = torch.zeros(N, T)
    latents[:, 0] = torch.randn(N, C, H, W, generator=g)
    model = LinearModel()
    with torch.no_grad():
        for j in range(T):
            x = latents[:, j]
            v = model.predict_velocity(x, None, cond.index_select(cond_index), transformer=dit)
            out = sde_step(SAMPLER, v, x, float(sigmas[j]), float(sigmas[j + 1]), ETA, generator=g)
            latents[:, j + 1], log_probs[:, j] = out.prev_sample, out.log_prob
    batch = SimpleNamespace(cond=cond, cond_index=cond_index, uncond=None, latents=latents, log_probs=log_probs,
                            sigmas=sigmas)
    return model, dit, batch


def _inputs(model, dit, ref, algorithm, beta):
    return PieceInputs(model=model, transformer=dit, ref_transformer=ref, device=torch.device("cpu"),
                       dtype=torch.float32, step=0, rank=0, seed=0, algorithm=algorithm, sampler=SAMPLER, eta=ETA,
                       cfg_scale=0.0, clip_range=0.2, beta=beta, kl_type="v-based", adv_clip_max=5.0, nft_beta=0.1)


@pytest.mark.parametrize("name", OBJECTIVE_NAMES)
def test_every_objective_gives_a_finite_differentiable_loss_with_its_stats(name):
    model, dit, batch = _setup()
    ref = copy.deepcopy(dit) if OBJECTIVES[name].uses_reference_dit else None
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5])
    loss, stats = policy_piece_loss(_inputs(model, dit, ref, name, beta=0.1), batch, adv, [0, 1, 2], 1)
    assert loss.dim() == 0 and torch.isfinite(loss)
    loss.backward()
    assert dit.weight.grad is not None and dit.weight.grad.abs().sum() > 0
    assert {"policy_loss", "ratio_max_abs_dev"} <= set(stats) and all(isinstance(v, float) for v in stats.values())
    # before any update the policy is the rollout policy: the likelihood ratio is exactly 1 (up to fp32 rounding)
    assert stats["ratio_max_abs_dev"] < 1e-5
    # the KL term exists exactly when the objective uses a reference DiT (θ = reference here, so KL = 0)
    assert ("kl" in stats) == OBJECTIVES[name].uses_reference_dit
    if "kl" in stats:
        assert stats["kl"] == 0.0


@pytest.mark.parametrize("name", OBJECTIVE_NAMES)
def test_single_update_only_is_enforced_by_the_config(name):
    if OBJECTIVES[name].single_update_only:
        with pytest.raises(ValueError, match="atrain_num_actor_update_steps"):
            GRPOConfig(output_dir="/tmp/x", atrain_algorithm=name, atrain_num_actor_update_steps=2, report_to="none")
    else:
        cfg = GRPOConfig(output_dir="/tmp/x", atrain_algorithm=name, atrain_num_actor_update_steps=2,
                         report_to="none")
        assert cfg.atrain_num_actor_update_steps == 2


def test_an_unknown_objective_is_refused_by_the_config():
    with pytest.raises(ValueError, match="atrain_algorithm must be one of"):
        GRPOConfig(output_dir="/tmp/x", atrain_algorithm="ppo", report_to="none")
