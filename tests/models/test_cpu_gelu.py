"""``--cpu_fast_gelu``: the DiT's tanh GELU as x·sigmoid(2u) is the same function as ATen's to float rounding, its
hand-written derivative is right (finite differences, float64), and ``predict_velocity`` patches whichever DiT it
runs (policy, copies) only when asked, leaving CUDA tensors and the weights alone."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F

from deepgen_rl.models.deepgen.cpu_gelu import tanh_gelu, use_cpu_fast_gelu, uses_cpu_fast_gelu
from deepgen_rl.trainer.deepspeed_utils import dit_from_state


def gelu_tanh_float64(x: torch.Tensor) -> torch.Tensor:
    """The closed form 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))) in float64."""
    x = x.double()
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def test_values_match_the_closed_form_to_float_rounding():
    g = torch.Generator().manual_seed(0)
    x = torch.cat([torch.randn(100_000, generator=g) * 3, torch.linspace(-60, 60, 10_001),
                   torch.tensor([0.0, -0.0, 1e-30, -1e-30, 88.0, -88.0, 1e4, -1e4])])
    ours, aten, exact = tanh_gelu(x), F.gelu(x, approximate="tanh"), gelu_tanh_float64(x)
    assert torch.isfinite(ours).all()
    # absolute error: both within ~1 float32 ulp of the largest values (|x| <= 60 here, 1e4 in the tail entries)
    big = x.abs() <= 60
    assert (ours.double() - exact)[big].abs().max().item() < 1e-6
    assert (aten.double() - exact)[big].abs().max().item() < 1e-6
    # relative error: ours stays within a few ulps even in the negative tail, where ATen's 1 + tanh(u) cancels
    # (measured: ours 1.0e-6 at most, ATen 1.5e-4 near x = -5)
    scale = exact.abs().clamp_min(1e-3)
    assert ((ours.double() - exact).abs() / scale).max().item() < 3e-6
    # far tails (x³ overflows beyond ~1e13) and non-finite inputs: exactly what ATen returns (-inf·0 and nan: nan)
    tail = torch.tensor([1e4, -1e4, 1e20, -1e20, float("inf"), float("-inf"), float("nan")])
    torch.testing.assert_close(tanh_gelu(tail), F.gelu(tail, approximate="tanh"), atol=0, rtol=0, equal_nan=True)
    assert tanh_gelu(tail)[:5].tolist() == [1e4, 0.0, float(torch.tensor(1e20)), 0.0, float("inf")]
    assert (ours != aten).any()  # a different formula: equal to rounding, not bit for bit (the docstring's claim)


def test_derivative_matches_finite_differences_and_atens():
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(64, generator=g, dtype=torch.float64) * 3).requires_grad_(True)
    assert torch.autograd.gradcheck(tanh_gelu, (x,), eps=1e-6, atol=1e-8, rtol=1e-6)
    xf = torch.linspace(-12, 12, 20_001, requires_grad=True)
    (ours,) = torch.autograd.grad(tanh_gelu(xf).sum(), xf)
    (aten,) = torch.autograd.grad(F.gelu(xf, approximate="tanh").sum(), xf)
    assert (ours - aten).abs().max().item() < 1e-5


def random_dit():
    from deepgen_rl.toy.model import VARIANTS
    from deepgen_rl.toy.pretrain import random_toy_dit

    torch.manual_seed(0)
    return random_toy_dit(VARIANTS["slots_wide"])


def dit_inputs(dit, rows=4):
    g = torch.Generator().manual_seed(2)
    return dict(hidden_states=torch.randn(rows, 16, 8, 8, generator=g),
                encoder_hidden_states=torch.randn(rows, 7, dit.config.joint_attention_dim, generator=g),
                pooled_projections=torch.randn(rows, dit.config.pooled_projection_dim, generator=g),
                timestep=torch.tensor([900.0, 500.0, 100.0, 10.0][:rows]), return_dict=False)


def test_patched_dit_computes_the_same_outputs_and_gradients():
    dit = random_dit()
    fast = copy.deepcopy(dit)
    n_ff = sum(1 for b in dit.transformer_blocks for ff in (b.ff, b.ff_context) if ff is not None)
    assert use_cpu_fast_gelu(fast) == n_ff > 0
    assert use_cpu_fast_gelu(fast) == n_ff  # idempotent
    assert uses_cpu_fast_gelu(fast) and not uses_cpu_fast_gelu(dit)
    for k, v in dit.state_dict().items():  # the patch touches no weight
        assert torch.equal(v, fast.state_dict()[k]), k
    inputs = dit_inputs(dit)
    out, out_fast = dit(**inputs)[0], fast(**inputs)[0]
    torch.testing.assert_close(out_fast, out, atol=1e-5, rtol=1e-5)
    out.square().mean().backward()
    out_fast.square().mean().backward()
    for (name, p), q in zip(dit.named_parameters(), fast.parameters()):
        torch.testing.assert_close(q.grad, p.grad, atol=1e-6, rtol=1e-4, msg=name)
    assert uses_cpu_fast_gelu(copy.deepcopy(fast))  # a deep copy (e.g. an EMA built by deepcopy) keeps it


def test_cuda_tensors_go_to_aten(monkeypatch):
    """A patched activation sends non-CPU tensors to F.gelu (checked with a tensor whose device reads 'cuda')."""
    from deepgen_rl.models.deepgen import cpu_gelu

    calls = []
    monkeypatch.setattr(cpu_gelu.F, "gelu", lambda t, approximate: calls.append(approximate) or t)

    class FakeCuda:
        device = torch.device("cuda", 0)

    t = FakeCuda()
    assert cpu_gelu._cpu_tanh_gelu(t) is t and calls == ["tanh"]


def test_predict_velocity_patches_only_when_asked(tiny_model):
    model = copy.copy(tiny_model)  # a shallow copy: its own cpu_fast_gelu flag, the shared modules untouched below
    cond = model.encode_prompts(["a red circle", "two blue squares on the left"])
    latents = torch.randn(2, *model.latent_shape(64, 64), generator=torch.Generator().manual_seed(3))
    sigma = torch.tensor([0.7, 0.3])
    plain = dit_from_state(model.transformer, model.transformer.state_dict(), device="cpu", dtype=torch.float32)
    fast = dit_from_state(model.transformer, model.transformer.state_dict(), device="cpu", dtype=torch.float32)
    assert model.cpu_fast_gelu is False  # off unless the trainer's --cpu_fast_gelu turns it on
    with torch.no_grad():
        v = model.predict_velocity(latents, sigma, cond, transformer=plain)
        assert not uses_cpu_fast_gelu(plain)
        model.cpu_fast_gelu = True
        v_fast = model.predict_velocity(latents, sigma, cond, transformer=fast)
    assert uses_cpu_fast_gelu(fast)  # a copy passed as transformer= (EMA, reference DiT) is patched too
    assert not uses_cpu_fast_gelu(tiny_model.transformer)
    torch.testing.assert_close(v_fast, v, atol=1e-5, rtol=1e-5)


def test_predict_velocity_walks_a_dits_modules_once(tiny_model, monkeypatch):
    """The patch is installed on the first forward of each DiT object, not searched for on every forward."""
    from deepgen_rl.models.deepgen import cpu_gelu

    model = copy.copy(tiny_model)
    model.cpu_fast_gelu = True
    walks = []
    real = cpu_gelu.use_cpu_fast_gelu
    monkeypatch.setattr(cpu_gelu, "use_cpu_fast_gelu", lambda m: walks.append(m) or real(m))
    cond = model.encode_prompts(["a red circle"])
    latents = torch.randn(1, *model.latent_shape(64, 64), generator=torch.Generator().manual_seed(3))
    one = dit_from_state(model.transformer, model.transformer.state_dict(), device="cpu", dtype=torch.float32)
    other = dit_from_state(model.transformer, model.transformer.state_dict(), device="cpu", dtype=torch.float32)
    with torch.no_grad():
        for dit in (one, one, other, one, other):
            model.predict_velocity(latents, torch.tensor([0.5]), cond, transformer=dit)
    assert walks == [one, other]
    assert uses_cpu_fast_gelu(one) and uses_cpu_fast_gelu(other)
    twin = copy.deepcopy(one)  # an EMA made by deepcopy: patched and marked, so no walk either
    with torch.no_grad():
        model.predict_velocity(latents, torch.tensor([0.5]), cond, transformer=twin)
    assert walks == [one, other] and uses_cpu_fast_gelu(twin)


@pytest.mark.parametrize("flag", [False, True])
def test_trainer_flag_reaches_the_model(tmp_path, flag):
    from tests.trainer.helpers import run_inprocess, tiny_model

    model = tiny_model()
    run_inprocess(tmp_path, model=model, max_steps=1, cpu_fast_gelu=flag)
    assert model.cpu_fast_gelu is flag
    assert uses_cpu_fast_gelu(model.transformer) is flag


def test_trainer_refuses_the_flag_on_a_dit_without_tanh_gelus(tmp_path):
    """The flag never silently does nothing: a DiT whose feed-forwards use the exact GELU is refused at start-up."""
    from diffusers.models.activations import GELU

    from tests.trainer.helpers import run_inprocess, tiny_model

    model = tiny_model()
    for m in model.transformer.modules():
        if isinstance(m, GELU):
            m.approximate = "none"
    with pytest.raises(ValueError, match="no tanh-approximate diffusers GELU"):
        run_inprocess(tmp_path, model=model, max_steps=1, cpu_fast_gelu=True)
