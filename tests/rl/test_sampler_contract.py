"""The sampler contract, checked on EVERY name in ``SAMPLERS`` (the one list config, rollout and docs use): a new
sampler is tested by adding its η to ``ETAS`` (a sampler without one fails with "add an eta for 'x'").

Contract: fp32 outputs of the documented shapes whatever the input dtype; sampling is reproducible with a generator;
scoring the sampled x' (``prev_sample=``) gives the sampling log-prob and mean; the mean is what the noise-free step
gives; log-prob gradients reach the velocity for stochastic samplers; per-sample σ equals scalar calls; every SDE
sampler names its default log-prob form and accepts its η in ``check_eta``.
"""

from __future__ import annotations

import pytest
import torch

from deepgen_rl.rl.samplers import (LOG_PROB_FORMS, SAMPLERS, SDE_SAMPLERS, check_eta, default_log_prob_form,
                                    sde_step)

ETAS = {"ode": 0.0, "flowgrpo_sde": 0.7, "cps_sde": 0.7, "dance_sde": 0.3}
SHAPE = (3, 4, 6, 6)


@pytest.fixture(params=SAMPLERS)
def sampler(request):
    if request.param not in ETAS:
        pytest.fail(f"add an eta for {request.param!r} to ETAS in tests/rl/test_sampler_contract.py")
    return request.param


def _xv(dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(SHAPE, generator=g).to(dtype), torch.randn(SHAPE, generator=g).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_outputs_are_fp32_with_the_documented_shapes(sampler, dtype):
    x, v = _xv(dtype)
    out = sde_step(sampler, v, x, 0.8, 0.6, ETAS[sampler], generator=torch.Generator().manual_seed(1))
    assert out.prev_sample.dtype == out.mean.dtype == out.std.dtype == out.log_prob.dtype == torch.float32
    assert out.prev_sample.shape == out.mean.shape == SHAPE
    assert out.std.shape == out.log_prob.shape == (SHAPE[0],)
    assert torch.isfinite(out.log_prob).all() and (out.std >= 0).all()


def test_sampling_is_reproducible_and_scoring_the_sample_gives_its_log_prob(sampler):
    x, v = _xv()
    a = sde_step(sampler, v, x, 0.8, 0.6, ETAS[sampler], generator=torch.Generator().manual_seed(3))
    b = sde_step(sampler, v, x, 0.8, 0.6, ETAS[sampler], generator=torch.Generator().manual_seed(3))
    assert torch.equal(a.prev_sample, b.prev_sample) and torch.equal(a.log_prob, b.log_prob)
    scored = sde_step(sampler, v, x, 0.8, 0.6, ETAS[sampler], prev_sample=a.prev_sample)
    torch.testing.assert_close(scored.log_prob, a.log_prob, rtol=0, atol=1e-6)
    torch.testing.assert_close(scored.mean, a.mean, rtol=0, atol=0)


def test_per_sample_sigmas_equal_scalar_calls(sampler):
    x, v = _xv()
    sig, nxt = torch.tensor([0.9, 0.6, 0.3]), torch.tensor([0.8, 0.45, 0.1])
    prev = x * 0.5
    batched = sde_step(sampler, v, x, sig, nxt, ETAS[sampler], prev_sample=prev)
    for i in range(SHAPE[0]):
        one = sde_step(sampler, v[i:i + 1], x[i:i + 1], float(sig[i]), float(nxt[i]), ETAS[sampler],
                       prev_sample=prev[i:i + 1])
        torch.testing.assert_close(batched.log_prob[i:i + 1], one.log_prob, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(batched.mean[i:i + 1], one.mean, rtol=1e-6, atol=1e-6)


def test_log_prob_gradient_reaches_the_velocity(sampler):
    if sampler not in SDE_SAMPLERS:
        pytest.skip("the ODE step is deterministic: log-prob 0, nothing to train")
    x, v = _xv()
    v.requires_grad_(True)
    prev = sde_step(sampler, v.detach(), x, 0.8, 0.6, ETAS[sampler], generator=torch.Generator().manual_seed(4))
    out = sde_step(sampler, v + 0.1, x, 0.8, 0.6, ETAS[sampler], prev_sample=prev.prev_sample)
    out.log_prob.sum().backward()
    assert v.grad is not None and v.grad.abs().sum() > 0


def test_every_sde_sampler_names_its_log_prob_form_and_accepts_its_eta(sampler):
    check_eta(sampler, ETAS[sampler])
    if sampler in SDE_SAMPLERS:
        assert default_log_prob_form(sampler) in LOG_PROB_FORMS
    else:
        assert default_log_prob_form(sampler) is None
