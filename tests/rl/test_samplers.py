import math

import pytest
import torch

from deepgen_rl.rl import (
    SAMPLERS,
    SDE_SAMPLERS,
    default_log_prob_form,
    make_sigmas,
    sde_step,
    sde_window,
    stochastic_step_mask,
    trained_step_indices,
)

SHAPE = (3, 4, 8, 8)


def _inputs(seed=0, shape=SHAPE, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g).to(dtype)
    v = torch.randn(shape, generator=g).to(dtype)
    return x, v


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def test_ode_is_euler():
    x, v = _inputs()
    out = sde_step("ode", v, x, 0.7, 0.5, eta=0.9)
    torch.testing.assert_close(out.prev_sample, x + (0.5 - 0.7) * v, rtol=0, atol=1e-6)
    assert torch.equal(out.prev_sample, out.mean)
    assert torch.equal(out.std, torch.zeros(SHAPE[0]))
    assert torch.equal(out.log_prob, torch.zeros(SHAPE[0]))


@pytest.mark.parametrize("sigma,sigma_next", [(1.0, 0.9), (0.7, 0.5), (0.1, 0.0)])
def test_cps_eta0_is_exactly_euler(sigma, sigma_next):
    x, v = _inputs()
    euler = sde_step("ode", v, x, sigma, sigma_next, eta=0.0)
    cps = sde_step("cps_sde", v, x, sigma, sigma_next, eta=0.0, generator=_gen(1))
    assert torch.equal(cps.mean, euler.mean)
    assert torch.equal(cps.prev_sample, euler.prev_sample)
    assert torch.equal(cps.std, torch.zeros(SHAPE[0]))


def test_cps_eta1_drops_predicted_noise_term():
    x, v = _inputs()
    sigma, sigma_next = 0.8, 0.6
    out = sde_step("cps_sde", v, x, sigma, sigma_next, eta=1.0, generator=_gen(0))
    x0_hat = x - sigma * v
    torch.testing.assert_close(out.mean, (1 - sigma_next) * x0_hat, rtol=0, atol=1e-6)
    torch.testing.assert_close(out.std, torch.full((SHAPE[0],), sigma_next))
    # Same x̂0, different x̂1 -> same mean: the x̂1 coefficient is zero.
    x2 = x + 0.3
    v2 = (x2 - x0_hat) / sigma
    out2 = sde_step("cps_sde", v2, x2, sigma, sigma_next, eta=1.0, generator=_gen(0))
    torch.testing.assert_close(out2.mean, out.mean, rtol=0, atol=1e-5)


def test_cps_coefficients_match_definition():
    x, v = _inputs()
    sigma, sigma_next, eta = 0.8, 0.6, 0.5
    out = sde_step("cps_sde", v, x, sigma, sigma_next, eta=eta, generator=_gen(0))
    s = sigma_next * math.sin(eta * math.pi / 2)
    expected = (1 - sigma_next) * (x - sigma * v) + math.sqrt(sigma_next**2 - s**2) * (x + (1 - sigma) * v)
    torch.testing.assert_close(out.mean, expected, rtol=0, atol=1e-5)
    torch.testing.assert_close(out.std, torch.full((SHAPE[0],), s))


@pytest.mark.parametrize("form", ["squared_error", "gaussian"])
def test_cps_last_step_is_deterministic(form):
    x, v = _inputs()
    a = sde_step("cps_sde", v, x, 0.05, 0.0, eta=0.7, generator=_gen(1), log_prob_form=form)
    b = sde_step("cps_sde", v, x, 0.05, 0.0, eta=0.7, generator=_gen(2), log_prob_form=form)
    assert torch.equal(a.std, torch.zeros(SHAPE[0]))
    assert torch.equal(a.prev_sample, b.prev_sample)
    assert torch.equal(a.prev_sample, a.mean)
    assert torch.equal(a.log_prob, torch.zeros(SHAPE[0]))
    torch.testing.assert_close(a.prev_sample, x - 0.05 * v)  # == Euler to x̂0


@pytest.mark.parametrize("sampler", [s for s in SDE_SAMPLERS if default_log_prob_form(s) == "gaussian"])
def test_gaussian_log_prob_matches_torch_normal(sampler):
    x, v = _inputs()
    sigma = torch.tensor([1.0, 0.6, 0.3])
    sigma_next = torch.tensor([0.95, 0.5, 0.0])
    out = sde_step(sampler, v, x, sigma, sigma_next, eta=0.7, generator=_gen(3))
    std = out.std.view(-1, 1, 1, 1).expand_as(out.mean)
    ref = torch.distributions.Normal(out.mean, std).log_prob(out.prev_sample).mean(dim=(1, 2, 3))
    torch.testing.assert_close(out.log_prob, ref, rtol=1e-6, atol=1e-5)
    assert out.log_prob.shape == (3,) and out.log_prob.dtype == torch.float32


def test_cps_squared_error_and_gaussian_forms():
    x, v = _inputs()
    out = sde_step("cps_sde", v, x, 0.7, 0.5, eta=0.6, generator=_gen(3))
    torch.testing.assert_close(out.log_prob, -((out.prev_sample - out.mean) ** 2).mean(dim=(1, 2, 3)))
    gauss = sde_step("cps_sde", v, x, 0.7, 0.5, eta=0.6, prev_sample=out.prev_sample, log_prob_form="gaussian")
    std = out.std.view(-1, 1, 1, 1).expand_as(out.mean)
    ref = torch.distributions.Normal(out.mean, std).log_prob(out.prev_sample).mean(dim=(1, 2, 3))
    torch.testing.assert_close(gauss.log_prob, ref, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("sampler", SDE_SAMPLERS)
def test_sampled_point_more_likely_than_shifted_point(sampler):
    x, v = _inputs(shape=(16, 4, 8, 8))
    out = sde_step(sampler, v, x, 0.7, 0.5, eta=0.8, generator=_gen(4))
    shifted = out.prev_sample + 0.5 * out.std.view(-1, 1, 1, 1)
    scored = sde_step(sampler, v, x, 0.7, 0.5, eta=0.8, prev_sample=shifted)
    assert out.log_prob.mean() > scored.log_prob.mean()
    # Scoring the step's own sample reproduces its log-prob.
    again = sde_step(sampler, v, x, 0.7, 0.5, eta=0.8, prev_sample=out.prev_sample)
    torch.testing.assert_close(again.log_prob, out.log_prob)


@pytest.mark.parametrize("sampler", SDE_SAMPLERS)
def test_generator_makes_sampling_reproducible(sampler):
    x, v = _inputs()
    a = sde_step(sampler, v, x, 0.7, 0.5, eta=0.8, generator=_gen(5))
    b = sde_step(sampler, v, x, 0.7, 0.5, eta=0.8, generator=_gen(5))
    c = sde_step(sampler, v, x, 0.7, 0.5, eta=0.8, generator=_gen(6))
    assert torch.equal(a.prev_sample, b.prev_sample) and torch.equal(a.log_prob, b.log_prob)
    assert not torch.equal(a.prev_sample, c.prev_sample)


@pytest.mark.parametrize("sampler", SDE_SAMPLERS)
def test_bf16_inputs_give_fp32_results_of_rounded_values(sampler):
    x, v = _inputs()
    xb, vb = x.bfloat16(), v.bfloat16()
    lo = sde_step(sampler, vb, xb, 0.7, 0.5, eta=0.8, generator=_gen(7))
    hi = sde_step(sampler, vb.float(), xb.float(), 0.7, 0.5, eta=0.8, generator=_gen(7))
    for out in (lo, hi):
        assert out.log_prob.dtype == out.mean.dtype == out.prev_sample.dtype == out.std.dtype == torch.float32
    torch.testing.assert_close(lo.log_prob, hi.log_prob, rtol=0, atol=1e-6)
    torch.testing.assert_close(lo.prev_sample, hi.prev_sample, rtol=0, atol=1e-6)
    # Scoring a bf16 prev_sample gives the fp32 log-prob of the rounded value.
    prev_b = hi.prev_sample.bfloat16()
    s_lo = sde_step(sampler, vb, xb, 0.7, 0.5, eta=0.8, prev_sample=prev_b)
    s_hi = sde_step(sampler, vb.float(), xb.float(), 0.7, 0.5, eta=0.8, prev_sample=prev_b.float())
    torch.testing.assert_close(s_lo.log_prob, s_hi.log_prob, rtol=0, atol=1e-6)


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_per_sample_sigma_equals_scalar_calls(sampler):
    x, v = _inputs()
    sig = torch.tensor([1.0, 0.6, 0.2])
    nxt = torch.tensor([0.9, 0.45, 0.0])
    batched = sde_step(sampler, v, x, sig, nxt, eta=0.6, generator=_gen(8))
    prev = batched.prev_sample
    for i in range(3):
        single = sde_step(sampler, v[i : i + 1], x[i : i + 1], float(sig[i]), float(nxt[i]), eta=0.6,
                          prev_sample=prev[i : i + 1])
        torch.testing.assert_close(single.mean, batched.mean[i : i + 1])
        torch.testing.assert_close(single.std, batched.std[i : i + 1])
        torch.testing.assert_close(single.log_prob, batched.log_prob[i : i + 1])


def test_flowgrpo_first_step_uses_next_sigma():
    x, v = _inputs()
    eta, sigma_next = 0.7, 0.96
    out = sde_step("flowgrpo_sde", v, x, 1.0, sigma_next, eta=eta, generator=_gen(9))
    s = eta * math.sqrt(1.0 / (1.0 - sigma_next))
    dt = sigma_next - 1.0
    expected_mean = x + (v + s**2 / 2 * x) * dt  # x̂1 = x at σ = 1
    assert torch.isfinite(out.log_prob).all()
    torch.testing.assert_close(out.std, torch.full((SHAPE[0],), s * math.sqrt(-dt)))
    torch.testing.assert_close(out.mean, expected_mean)
    # General σ < 1: s = η·sqrt(σ/(1−σ)).
    out2 = sde_step("flowgrpo_sde", v, x, 0.6, 0.5, eta=eta, generator=_gen(9))
    torch.testing.assert_close(out2.std, torch.full((SHAPE[0],), eta * math.sqrt(0.6 / 0.4) * math.sqrt(0.1)))


def test_dance_coefficients():
    x, v = _inputs()
    eta, sigma, sigma_next = 0.3, 0.6, 0.5
    out = sde_step("dance_sde", v, x, sigma, sigma_next, eta=eta, generator=_gen(9))
    dt = sigma_next - sigma
    expected = x + (v + eta**2 / (2 * sigma) * (x + (1 - sigma) * v)) * dt
    torch.testing.assert_close(out.mean, expected)
    torch.testing.assert_close(out.std, torch.full((SHAPE[0],), eta * math.sqrt(-dt)))


@pytest.mark.parametrize("sampler", SDE_SAMPLERS)
def test_gradient_flows_from_log_prob_to_velocity_when_scoring(sampler):
    x, v = _inputs()
    prev = sde_step(sampler, v, x, 0.7, 0.5, eta=0.8, generator=_gen(10)).prev_sample
    assert not prev.requires_grad
    v_train = (v + 0.05).bfloat16().requires_grad_(True)
    out = sde_step(sampler, v_train, x, 0.7, 0.5, eta=0.8, prev_sample=prev)
    out.log_prob.sum().backward()
    assert v_train.grad is not None and torch.isfinite(v_train.grad.float()).all()
    assert v_train.grad.float().abs().sum() > 0


@pytest.mark.parametrize("sigma,sigma_next", [(0.5, 0.5), (0.5, 0.6), (0.0, 0.0), (1.2, 0.5), (0.5, -0.1)])
def test_invalid_sigmas_raise(sigma, sigma_next):
    x, v = _inputs()
    with pytest.raises(ValueError):
        sde_step("flowgrpo_sde", v, x, sigma, sigma_next, eta=0.7)


def test_unknown_sampler_and_form_raise():
    x, v = _inputs()
    with pytest.raises(ValueError):
        sde_step("ddim", v, x, 0.7, 0.5, eta=0.7)
    with pytest.raises(ValueError):
        sde_step("cps_sde", v, x, 0.7, 0.5, eta=0.7, log_prob_form="laplace")


@pytest.mark.parametrize("sampler", SDE_SAMPLERS)
def test_monte_carlo_moments_match_mean_and_std(sampler):
    """x' over n = 20000 draws: per-dim sample mean within 5 standard errors (std/√n) of μ, sample variance
    within 5 standard errors (std²·√(2/(n−1)), Gaussian) of std²; 5 SE over 4·8 = 32 checks keeps the chance of
    a false failure below 1e-4 for any seed."""
    n, d = 20000, 4
    g = _gen(11)
    x = torch.randn(1, d, 1, 1, generator=g).expand(n, d, 1, 1).contiguous()
    v = torch.randn(1, d, 1, 1, generator=g).expand(n, d, 1, 1).contiguous()
    for sigma, sigma_next in [(1.0, 0.95), (0.8, 0.7), (0.3, 0.2), (0.1, 0.02)]:
        out = sde_step(sampler, v, x, sigma, sigma_next, eta=0.8, generator=_gen(12))
        mu, std = out.mean[0].flatten(), float(out.std[0])
        samples = out.prev_sample.flatten(1)
        se_mean = std / math.sqrt(n)
        assert (samples.mean(0) - mu).abs().max() < 5 * se_mean
        se_var = std**2 * math.sqrt(2 / (n - 1))
        assert (samples.var(0) - std**2).abs().max() < 5 * se_var


@pytest.mark.parametrize("steps", [10, 50])
@pytest.mark.parametrize("shift", [1.0, 3.0])
def test_make_sigmas_matches_diffusers(steps, shift):
    from diffusers import FlowMatchEulerDiscreteScheduler

    scheduler = FlowMatchEulerDiscreteScheduler(shift=shift)
    scheduler.set_timesteps(steps)
    sigmas = make_sigmas(steps, shift)
    assert sigmas.dtype == torch.float32 and sigmas.shape == (steps + 1,)
    torch.testing.assert_close(sigmas, scheduler.sigmas.float(), rtol=0, atol=1e-7)
    assert sigmas[0] == 1.0 and sigmas[-1] == 0.0 and bool((sigmas[1:] < sigmas[:-1]).all())


def test_trained_steps_timestep_fraction():
    assert trained_step_indices(50, timestep_fraction=0.6) == list(range(30))
    assert trained_step_indices(10, timestep_fraction=1.0) == list(range(9))  # never the last step
    assert trained_step_indices(10) == list(range(9))
    a = trained_step_indices(50, timestep_fraction=0.6, generator=_gen(0))
    b = trained_step_indices(50, timestep_fraction=0.6, generator=_gen(0))
    c = trained_step_indices(50, timestep_fraction=0.6, generator=_gen(1))
    assert a == b and a != c
    assert len(a) == 30 == len(set(a)) and a == sorted(a) and max(a) <= 48 and min(a) >= 0


def test_sde_window_and_mask():
    assert sde_window(20, 0) is None
    assert stochastic_step_mask(5, None) == [True] * 5
    assert sde_window(20, 4, (2, 10)) == (2, 6)  # no generator: deterministic start at lo
    starts = set()
    for seed in range(50):
        start, end = sde_window(20, 4, (2, 10), generator=_gen(seed))
        assert end - start == 4 and 2 <= start and end <= 10
        starts.add(start)
        mask = stochastic_step_mask(20, (start, end))
        steps = trained_step_indices(20, window=(start, end))
        assert steps == [j for j in range(20) if mask[j]] == list(range(start, end))
    assert starts == set(range(2, 7))
    assert sde_window(20, 4, generator=_gen(3)) == sde_window(20, 4, generator=_gen(3))
    assert max(sde_window(20, 19, generator=_gen(3))) == 19  # default range excludes the last step
    with pytest.raises(ValueError):
        sde_window(20, 12, (0, 10))
    with pytest.raises(ValueError):
        trained_step_indices(20, timestep_fraction=0.5, window=(0, 4))


@pytest.mark.parametrize("sampler,eta", [("flowgrpo_sde", -0.5), ("dance_sde", -1.0), ("cps_sde", 1.5),
                                         ("flowgrpo_sde", float("nan"))])
def test_invalid_eta_is_rejected(sampler, eta):
    x = torch.randn(2, 4, 2, 2)
    with pytest.raises(ValueError, match="eta"):
        sde_step(sampler, torch.randn_like(x), x, 0.7, 0.5, eta)
