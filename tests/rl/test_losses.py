import pytest
import torch

from deepgen_rl.rl import (
    SDE_SAMPLERS,
    advantages_to_nft_reward,
    clipped_policy_loss,
    default_log_prob_form,
    diffusionnft_loss,
    grpo_guard_log_ratio,
    grpo_guard_step_weight,
    kl_penalty,
    sde_step,
    sft_flow_matching_loss,
)


def _randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------------------------------------- clipped surrogate


def test_on_policy_ratio_is_one_and_gradient_is_policy_gradient():
    old = _randn(6)
    log_prob = old.clone().requires_grad_(True)
    adv = torch.tensor([1.0, -2.0, 0.5, 0.0, 3.0, -0.1])
    loss, stats = clipped_policy_loss(log_prob, old, adv, clip_range=1e-4)
    loss.backward()
    torch.testing.assert_close(log_prob.grad, -adv / 6)
    assert float(stats["ratio_mean"]) == 1.0 and float(stats["ratio_min"]) == 1.0 == float(stats["ratio_max"])
    assert float(stats["clip_fraction"]) == 0.0 and float(stats["approx_kl"]) == 0.0
    torch.testing.assert_close(loss, -adv.mean())


def test_clipping_kills_gradient_exactly_where_it_should():
    ratio = torch.tensor([1.5, 0.5, 1.5, 0.5, 1.1, 0.9])
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0, 1.0, -1.0])
    old = torch.zeros(6)
    log_prob = ratio.log().requires_grad_(True)
    loss, stats = clipped_policy_loss(log_prob, old, adv, clip_range=0.2)
    loss.backward()
    killed = torch.tensor([True, False, False, True, False, False])  # A>0 ∧ ρ>1.2; A<0 ∧ ρ<0.8
    assert torch.equal(log_prob.grad == 0, killed)
    # Where not clipped: d/dlogp (−A·ρ) / N = −A·ρ / N.
    torch.testing.assert_close(log_prob.grad[~killed], (-adv * ratio / 6)[~killed])
    assert float(stats["clip_fraction"]) == pytest.approx(2 / 6)
    torch.testing.assert_close(stats["approx_kl"], 0.5 * (ratio.log() ** 2).mean())


def test_asymmetric_clip_range():
    ratio = torch.tensor([0.85, 1.25, 1.35, 0.95])
    adv = torch.tensor([-1.0, 1.0, 1.0, -1.0])
    log_prob = ratio.log().requires_grad_(True)
    loss, stats = clipped_policy_loss(log_prob, torch.zeros(4), adv, clip_range=(0.1, 0.3))  # ρ ∈ [0.9, 1.3]
    loss.backward()
    assert torch.equal(log_prob.grad == 0, torch.tensor([True, False, True, False]))
    assert float(stats["clip_fraction"]) == 0.5


# ---------------------------------------------------------------------------------------------- KL


@pytest.mark.parametrize("kl_type", ["v-based", "x-based"])
def test_kl_zero_when_theta_equals_ref(kl_type):
    v = _randn(3, 4, 5, 5)
    out = kl_penalty(kl_type, v_theta=v, v_ref=v.clone(), mean_theta=v, mean_ref=v.clone(), std=torch.rand(3) + 0.1)
    assert out.shape == (3,) and torch.equal(out, torch.zeros(3))


def test_x_based_kl_matches_gaussian_closed_form():
    mu_t, mu_r = _randn(3, 4, 5, 5, seed=1), _randn(3, 4, 5, 5, seed=2)
    std = torch.tensor([0.3, 0.7, 1.5])
    out = kl_penalty("x-based", v_theta=mu_t, v_ref=mu_r, mean_theta=mu_t, mean_ref=mu_r, std=std)
    s = std.view(3, 1, 1, 1).expand_as(mu_t)
    ref = torch.distributions.kl_divergence(torch.distributions.Normal(mu_t, s), torch.distributions.Normal(mu_r, s))
    torch.testing.assert_close(out, ref.mean(dim=(1, 2, 3)))
    torch.testing.assert_close(out, ((mu_t - mu_r) ** 2).mean(dim=(1, 2, 3)) / (2 * std**2))


def test_v_based_kl_scaling_and_gradient_reaches_theta_only():
    v_t = _randn(2, 3, 4, 4, seed=3).requires_grad_(True)
    v_r = _randn(2, 3, 4, 4, seed=4).requires_grad_(True)
    std = torch.tensor([0.5, 2.0])
    out = kl_penalty("v-based", v_theta=v_t, v_ref=v_r, std=std)
    d = 3 * 4 * 4
    torch.testing.assert_close(out, ((v_t - v_r) ** 2).mean(dim=(1, 2, 3)) / (2 * std**2))
    out.sum().backward()
    assert v_r.grad is None
    torch.testing.assert_close(v_t.grad, (v_t - v_r).detach() / (std.view(2, 1, 1, 1) ** 2 * d))
    unscaled = kl_penalty("v-based", v_theta=v_t, v_ref=v_r, std=None)
    torch.testing.assert_close(unscaled, ((v_t - v_r) ** 2).mean(dim=(1, 2, 3)) / 2)


def test_kl_rejects_deterministic_step_and_unknown_type():
    v = _randn(2, 3, 4, 4)
    with pytest.raises(ValueError):
        kl_penalty("v-based", v_theta=v, v_ref=v, std=torch.tensor([0.5, 0.0]))
    with pytest.raises(ValueError):
        kl_penalty("x-based", v_theta=v, v_ref=v, std=1.0)  # no means
    with pytest.raises(ValueError):
        kl_penalty("k3", v_theta=v, v_ref=v, std=1.0)


# ---------------------------------------------------------------------------------------------- GRPO-Guard


@pytest.mark.parametrize("sampler", SDE_SAMPLERS)
def test_grpo_guard_ratio_is_centred_and_step_scale_free(sampler):
    """RatioNorm turns log p_θ − log p_old into mean_D[(μ_θ − μ_old)·ξ]: no negative shift, no 1/std scale."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 4, 4, 4, generator=g)
    v_old = torch.randn(1, 4, 4, 4, generator=g).expand_as(x)
    v_new = v_old + 0.3 * torch.randn(1, 4, 4, 4, generator=g)
    for sigma, sigma_next in [(0.9, 0.8), (0.3, 0.25)]:
        old = sde_step(sampler, v_old, x, sigma, sigma_next, eta=0.8, generator=g)
        new = sde_step(sampler, v_new, x, sigma, sigma_next, eta=0.8, prev_sample=old.prev_sample)
        form = default_log_prob_form(sampler)
        guard = grpo_guard_log_ratio(new.log_prob, old.log_prob, new.mean, old.mean, old.std, log_prob_form=form)
        xi = (old.prev_sample - old.mean) / old.std.view(-1, 1, 1, 1)
        identity = ((new.mean - old.mean) * xi).flatten(1).mean(1)
        torch.testing.assert_close(guard, identity, rtol=1e-3, atol=1e-5)
        raw = new.log_prob - old.log_prob
        assert raw.mean() < -3 * raw.std() / 256**0.5  # the raw log-ratio is shifted left
        assert guard.mean().abs() < 4 * guard.std() / 256**0.5  # the normalised one is centred


def test_grpo_guard_step_weight():
    torch.testing.assert_close(grpo_guard_step_weight(0.8, 0.6), torch.tensor(5.0))
    torch.testing.assert_close(grpo_guard_step_weight(torch.tensor([1.0, 0.5]), torch.tensor([0.9, 0.25])),
                               torch.tensor([10.0, 4.0]))
    with pytest.raises(ValueError):
        grpo_guard_step_weight(0.5, 0.5)


# ---------------------------------------------------------------------------------------------- DiffusionNFT / SFT


def test_advantages_to_nft_reward():
    out = advantages_to_nft_reward(torch.tensor([0.0, 5.0, -5.0, 2.5, 10.0, -10.0]), clip_max=5.0)
    torch.testing.assert_close(out, torch.tensor([0.5, 1.0, 0.0, 0.75, 1.0, 0.0]))


def test_diffusionnft_beta_one_is_flow_matching_on_v_theta():
    v_t, v_o, x0, eps = (_randn(2, 3, 4, 4, seed=s) for s in range(4))
    loss = diffusionnft_loss(v_t, v_o, x0, eps, torch.ones(2), beta=1.0)
    torch.testing.assert_close(loss, sft_flow_matching_loss(v_t, eps, x0))
    # r = 0 with β = 1: v⁻ = 2·v_old − v_θ.
    loss_neg = diffusionnft_loss(v_t, v_o, x0, eps, torch.zeros(2), beta=1.0)
    torch.testing.assert_close(loss_neg, (((2 * v_o - v_t) - (eps - x0)) ** 2).mean())


@pytest.mark.parametrize("beta", [0.1, 1.0])
def test_diffusionnft_minimisers(beta):
    v_o, x0, eps = (_randn(2, 3, 4, 4, seed=s) for s in range(1, 4))
    target = eps - x0
    # r = 1: minimised (loss 0, zero gradient) where v⁺ = β·v_θ + (1−β)·v_old hits the target.
    v_star = ((target - (1 - beta) * v_o) / beta).requires_grad_(True)
    loss = diffusionnft_loss(v_star, v_o, x0, eps, torch.ones(2), beta)
    loss.backward()
    assert loss.item() < 1e-10 and float(v_star.grad.abs().max()) < 1e-6
    # r = 0: minimised where v⁻ = (1+β)·v_old − β·v_θ hits the target, i.e. v_θ moves away from it.
    v_neg = (((1 + beta) * v_o - target) / beta).requires_grad_(True)
    loss = diffusionnft_loss(v_neg, v_o, x0, eps, torch.zeros(2), beta)
    loss.backward()
    assert loss.item() < 1e-10 and float(v_neg.grad.abs().max()) < 1e-6
    # r = 1: a gradient step from v_old moves v⁺ towards the target; v_old gets no gradient.
    v_old_leaf = v_o.clone().requires_grad_(True)
    v_t = v_o.clone().requires_grad_(True)
    loss = diffusionnft_loss(v_t, v_old_leaf, x0, eps, torch.ones(2), beta)
    loss.backward()
    assert v_old_leaf.grad is None
    stepped = diffusionnft_loss(v_t - 0.1 * v_t.grad, v_o, x0, eps, torch.ones(2), beta)
    assert stepped < loss


def test_sft_flow_matching_loss_fp32():
    v, eps, x0 = (_randn(2, 3, 4, 4, seed=s).bfloat16() for s in range(3))
    out = sft_flow_matching_loss(v, eps, x0)
    assert out.dtype == torch.float32 and out.ndim == 0
    torch.testing.assert_close(out, ((v.float() - (eps.float() - x0.float())) ** 2).mean())
