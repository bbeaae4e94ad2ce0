"""Start-up checks for GPU runs, exercised on the CPU: DeepSpeed CPU Adam buildability for zero3_offload (mocked
CUDA machine) and train.sh's multi-node OUTPUT_DIR rule."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

from deepgen_rl.trainer import deepspeed_utils as du
from tests.trainer.helpers import ROOT, subprocess_env

OFFLOAD = json.loads((ROOT / "scripts/deepspeed/zero3_offload.json").read_text())
ZERO2 = json.loads((ROOT / "scripts/deepspeed/zero2.json").read_text())


@pytest.fixture
def gpu_node(monkeypatch, tmp_path):
    """A CUDA 12.4 machine without a prebuilt cpu_adam; returns a function that sets the toolkit's state."""
    import deepspeed.git_version_info as gvi
    from torch.utils import cpp_extension

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    monkeypatch.setattr(gvi, "installed_ops", {"cpu_adam": False})
    monkeypatch.setattr(cpp_extension, "is_ninja_available", lambda: True)

    def toolkit(home: str | None, release: str | None = "12.4", nvcc: bool = True):
        monkeypatch.setattr(cpp_extension, "CUDA_HOME", home)
        if home and nvcc:
            (Path(home) / "bin").mkdir(parents=True, exist_ok=True)
            (Path(home) / "bin" / "nvcc").write_text("")
        monkeypatch.setattr(du, "_nvcc_release", lambda path: release)

    return toolkit


def test_cpu_adam_check_names_what_is_missing(gpu_node, tmp_path, monkeypatch):
    gpu_node(None)
    assert "CUDA_HOME is unset" in du.cpu_adam_problem(OFFLOAD)
    assert du.cpu_adam_problem(ZERO2) is None  # no optimizer offload: nothing to build
    gpu_node(str(tmp_path / "cuda"), nvcc=False)
    assert "bin/nvcc not found" in du.cpu_adam_problem(OFFLOAD)
    gpu_node(str(tmp_path / "cuda"), release="11.8")
    msg = du.cpu_adam_problem(OFFLOAD)
    assert "CUDA 11.8" in msg and "CUDA 12.4" in msg and "\n" not in msg
    gpu_node(str(tmp_path / "cuda"), release="12.1")
    assert du.cpu_adam_problem(OFFLOAD) is None  # same major version: buildable
    from torch.utils import cpp_extension

    monkeypatch.setattr(cpp_extension, "is_ninja_available", lambda: False)
    assert "ninja" in du.cpu_adam_problem(OFFLOAD)
    import deepspeed.git_version_info as gvi

    monkeypatch.setattr(gvi, "installed_ops", {"cpu_adam": True})
    assert du.cpu_adam_problem(OFFLOAD) is None  # prebuilt: nothing to compile


def test_cpu_adam_check_is_silent_on_cpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert du.cpu_adam_problem(OFFLOAD) is None


def test_multinode_train_sh_requires_output_dir(tmp_path):
    env = subprocess_env(NNODES="2", NODE_RANK="1")
    env.pop("OUTPUT_DIR", None)
    proc = subprocess.run(["bash", str(ROOT / "scripts/train.sh"), "--max_steps", "1"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "NNODES=2 needs OUTPUT_DIR" in proc.stderr


def test_sde_step_checks_float_sigmas_on_the_host(monkeypatch):
    """Float sigmas (what rollout and training pass) are validated as floats: the tensor check, whose bool() waits
    for the GPU, does not run; bad floats still raise."""
    from deepgen_rl.rl import samplers

    def tensor_check(*_):
        raise AssertionError("tensor check ran for float sigmas")

    x = torch.randn(2, 4, 2, 2, generator=torch.Generator().manual_seed(0))
    expected = samplers.sde_step("cps_sde", x, x, 0.5, 0.25, 0.7, generator=torch.Generator().manual_seed(1))
    monkeypatch.setattr(samplers, "_check_sigmas", tensor_check)
    out = samplers.sde_step("cps_sde", x, x, 0.5, 0.25, 0.7, generator=torch.Generator().manual_seed(1))
    assert torch.equal(out.prev_sample, expected.prev_sample)
    for bad in ((0.5, 0.5), (1.5, 0.2), (0.5, -0.1), (0.0, 0.0)):
        with pytest.raises(ValueError, match="sigma_next"):
            samplers.sde_step("ode", x, x, *bad, 0.0)
    with pytest.raises(AssertionError, match="tensor check"):  # tensors still take the (device) check
        samplers.sde_step("ode", x, x, torch.tensor(0.5), torch.tensor(0.25), 0.0)


def test_chunked_vae_decode_equals_one_call():
    from deepgen_rl.rollout import decode_latents_chunked
    from tests.trainer.helpers import tiny_model

    model = tiny_model()
    z = torch.randn(5, *model.latent_shape(32, 32), generator=torch.Generator().manual_seed(0))
    full = model.decode_latents(z)
    for chunk in (1, 2, 5, 8):
        # fp32 kernels differ by batch size: ~3e-6 on images in [0, 1]
        assert torch.allclose(decode_latents_chunked(model, z, chunk), full, atol=1e-5, rtol=0)
    calls = []
    orig = model.decode_latents
    model.decode_latents = lambda part: calls.append(part.shape[0]) or orig(part)
    decode_latents_chunked(model, z, 2)
    assert calls == [2, 2, 1]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dit_from_state_matches_a_loaded_copy_without_random_init(dtype, monkeypatch):
    """The eval/reference DiT built on the meta device and filled with assign=True: same outputs as the source
    weights, in the asked dtype, never running a real (CPU) parameter initialisation, and a copy (not a view) of
    the live weights by default."""
    from deepgen_rl.trainer.deepspeed_utils import dit_from_state
    from tests.trainer.helpers import tiny_model

    model = tiny_model()
    live = model.transformer.float()
    state = {n: p.detach() + 0.01 for n, p in live.named_parameters()}  # e.g. EMA weights != live ones
    real_inits = []

    def spy(orig):
        def init(*args, **kwargs):
            t = args[0] if args else kwargs["tensor"]
            if not t.is_meta:
                real_inits.append(tuple(t.shape))
            return orig(*args, **kwargs)
        return init

    for name in ("normal_", "kaiming_uniform_", "uniform_", "xavier_uniform_", "trunc_normal_", "zeros_"):
        monkeypatch.setattr(torch.nn.init, name, spy(getattr(torch.nn.init, name)))
    built = dit_from_state(live, state, device="cpu", dtype=dtype)
    assert real_inits == []
    assert all(p.dtype == dtype and not p.requires_grad for p in built.parameters())
    sd = built.state_dict()
    for n, v in state.items():
        assert torch.equal(sd[n], v.to(dtype)), n
    assert torch.equal(sd["pos_embed.pos_embed"], live.state_dict()["pos_embed.pos_embed"].to(dtype))
    if dtype == torch.float32:
        ref = dit_from_state(live, live.state_dict(), device="cpu", dtype=dtype)
        with torch.no_grad():
            next(live.parameters()).add_(1.0)
        assert not torch.equal(next(ref.parameters()), next(live.parameters()))  # a copy, not a view
