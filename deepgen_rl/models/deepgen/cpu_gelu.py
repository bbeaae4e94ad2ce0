"""A faster tanh-approximate GELU for DiTs that run on the CPU (``--cpu_fast_gelu``).

SD3's feed-forward layers apply ``F.gelu(x, approximate="tanh")`` = 0.5·x·(1 + tanh(u)), u = √(2/π)·(x + 0.044715·x³).
ATen evaluates it on an AVX2 CPU through its accurate vectorised tanh, which is slow: in the toy DiT (96 wide, 64
images of 64 + 28 tokens) one GELU takes ~4 ms and the five of a forward ~22% of it (torch.profiler, one thread).
Since 0.5·(1 + tanh(u)) = sigmoid(2u), the same function is x·sigmoid(2u), which ATen computes in a few cheap passes
(~3x faster: 0.35x the time in bench/cpu_gelu.py); its derivative, written out in :class:`TanhGELU`, avoids ATen's
tanh-based ``gelu_backward`` too. The two formulas agree to float rounding (1e-6 relative at most), not bit for bit:
a run with the option repeats to the last digit, but it is not the run without the option to the last digit.

The patch is per module instance and acts on CPU tensors only (a CUDA tensor still goes to ``F.gelu``), so a GPU run
is untouched even with the option on. ``DeepGen.predict_velocity`` installs it on whichever DiT it runs (the policy,
a DeepSpeed engine's module, an EMA or reference copy) when ``DeepGen.cpu_fast_gelu`` is true, like the text-masked
attention, so no copy is forgotten.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

_C = 2.0 * math.sqrt(2.0 / math.pi)  # sigmoid(C·(x + A·x³)) = 0.5·(1 + tanh(√(2/π)·(x + A·x³)))
_A = 0.044715


class TanhGELU(torch.autograd.Function):
    """y = x·s, s = sigmoid(C·(x + A·x³)); dy/dx = s + C·(x + 3A·x³)·s·(1 − s)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        s = torch.mul(x, x).mul_(_C * _A).add_(_C).mul_(x).sigmoid_()  # C·(x + A·x³) = x·(C + C·A·x²)
        ctx.save_for_backward(x, s)
        return s * x

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        x, s = ctx.saved_tensors
        ds = torch.addcmul(s, s, s, value=-1.0)  # s·(1 − s)
        return torch.mul(x, x).mul_(3.0 * _C * _A).add_(_C).mul_(x).mul_(ds).add_(s).mul_(grad)


def tanh_gelu(x: torch.Tensor) -> torch.Tensor:
    """``F.gelu(x, approximate="tanh")`` computed as x·sigmoid(2u) (see the module docstring)."""
    return TanhGELU.apply(x)


def _cpu_tanh_gelu(gate: torch.Tensor) -> torch.Tensor:
    """What a patched diffusers ``GELU.gelu`` runs: :func:`tanh_gelu` on the CPU, ``F.gelu`` elsewhere."""
    if gate.device.type == "cpu":
        return tanh_gelu(gate)
    return F.gelu(gate, approximate="tanh")


def use_cpu_fast_gelu(module: nn.Module) -> int:
    """Route every tanh-approximate diffusers ``GELU`` inside ``module`` through :func:`tanh_gelu` on the CPU.

    Idempotent and cheap (one walk over the modules). Returns how many activations are patched; a module with no
    tanh GELU (e.g. an exact-GELU feed-forward) is left as it is and gives 0.
    """
    from diffusers.models.activations import GELU

    n = 0
    for sub in module.modules():
        if isinstance(sub, GELU) and sub.approximate == "tanh":
            if sub.__dict__.get("gelu") is not _cpu_tanh_gelu:
                sub.gelu = _cpu_tanh_gelu  # an instance attribute shadows the class's method
            n += 1
    return n


_INSTALLED = "_deepgen_cpu_fast_gelu_installed"  # marks a module that ensure_cpu_fast_gelu has walked


def ensure_cpu_fast_gelu(module: nn.Module) -> None:
    """:func:`use_cpu_fast_gelu` once per module object: later calls cost one attribute lookup, not a walk over
    every submodule (``predict_velocity`` calls this on every forward: the walk took ~2% of a toy rollout). A copy of
    a patched module (``copy.deepcopy``: an EMA) carries both the patch and the mark."""
    if not module.__dict__.get(_INSTALLED, False):
        use_cpu_fast_gelu(module)
        module.__dict__[_INSTALLED] = True


def uses_cpu_fast_gelu(module: nn.Module) -> bool:
    """Whether :func:`use_cpu_fast_gelu` patched any activation of ``module``."""
    return any(sub.__dict__.get("gelu") is _cpu_tanh_gelu for sub in module.modules())
