"""EMA of the DiT's fp32 master weights, kept per rank on that rank's partition of the masters.

``ema ← d·ema + (1 − d)·master`` after every applied optimizer step, elementwise, in fp32. The masters are the
optimizer's fp32 weights (under DeepSpeed's bf16/fp16 mode the module only holds low-precision copies of them).

Storage per rank (``P`` = number of DiT parameters, ``W`` = data-parallel world size):

- ZeRO-1/2 (and DeepSpeed's bf16 optimizer): each parameter's fp32 master is a slice of one flat partition per rank;
  ``param._hp_mapping`` gives this rank's fragment (``hp_fragment``, a view into the partition) and where it sits in
  the flattened parameter (``lp_fragment_address.start`` / ``.numel``); a parameter outside this rank's partition has
  no mapping (``None``) and an empty fragment here. The fragments of all ranks tile the parameter exactly.
- ZeRO-3: ``deepspeed.utils.safe_get_local_fp32_param`` gives this rank's fp32 partition of the parameter (read here
  through the optimizer method it wraps, which leaves it where it lives: on the host under ``offload_optimizer``, so
  the EMA stays there too), a contiguous block of ``ds_tensor.numel()`` elements starting at
  ``partition_rank · ds_tensor.numel()`` of the flattened parameter (the last rank's block is zero-padded past
  ``ds_numel``; the padding is not stored). Parameters that ZeRO-3 keeps whole in the module (below
  ``stage3_param_persistence_threshold``) still have partitioned fp32 masters.
- No DeepSpeed (or a DeepSpeed mode without separate masters): the parameter itself is the master and is replicated;
  the EMA keeps the full fp32 tensor (every rank holds the same copy, as it holds the same weights).

So under ZeRO the EMA takes ``4·P/W`` bytes per rank (:meth:`PartitionedEMA.numel_local` ≈ ``P/W``). :meth:`update`
is local: no collective (ZeRO-3's fragment lookup waits on DeepSpeed's reduce stream, a device-side sync); the
fragments are looked up again at every update, since DeepSpeed re-links them when it loads a checkpoint. Only
:meth:`full_state_dict` / :meth:`iter_full` (save, evaluation) assemble full tensors: one parameter at a time, each
rank writes its fragment into a zero fp32 buffer of the full size at its offset, then one ``all_reduce`` (SUM) over
the parameter's data-parallel group — a collective that every rank must call, in the same order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import torch


@dataclass
class _Slot:
    name: str
    shape: torch.Size
    start: int  # offset of this rank's fragment in the flattened parameter
    ema: torch.Tensor  # fp32, 1-D, this rank's fragment (empty when the rank holds none)
    replicated: bool  # True: ``ema`` is the whole parameter, identical on every rank (no reduction to gather)
    group: object  # the process group the fragments of this parameter are spread over (None = the default one)


def _local_master(p) -> tuple[torch.Tensor, int, bool, object]:
    """(this rank's fp32 master fragment of ``p`` as a 1-D view, its offset in ``p.flatten()``, replicated, group).

    No collective. The returned view aliases the optimizer's storage: read it, never write it.
    """
    if hasattr(p, "ds_id") and getattr(p, "_z3_optimizer", None) is not None and p.requires_grad:  # ZeRO-3
        from deepspeed.utils import safe_get_local_fp32_param

        opt = p._z3_optimizer
        if hasattr(opt, "_get_fp32_opt_state_partition"):  # the partition where it lives (host under offload)
            local = opt._get_fp32_opt_state_partition(p, release_swap_buffers=True)[0].reshape(-1)
        else:  # the public API copies it to the accelerator
            local = safe_get_local_fp32_param(p).reshape(-1)
        start = opt._get_param_partition_rank(p) * local.numel()
        valid = max(0, min(local.numel(), int(p.ds_numel) - start))
        if valid == 0:  # a tensor smaller than the world: this rank's block is all padding
            start = 0
        return local[:valid], start, False, opt._get_param_partition_group(p)
    if hasattr(p, "_hp_mapping"):  # ZeRO-1/2, DeepSpeed's bf16 optimizer
        mapping = p._hp_mapping
        if mapping is None:  # the whole parameter lies in other ranks' partitions
            return torch.empty(0, dtype=torch.float32, device=p.device), 0, False, p._dp_group
        frag = mapping.get_hp_fragment().reshape(-1)
        address = mapping.lp_fragment_address
        if frag.numel() != address.numel:
            raise RuntimeError(f"DeepSpeed fp32 fragment of {tuple(p.shape)} has {frag.numel()} elements, "
                               f"its address says {address.numel}")
        return frag, int(address.start), False, p._dp_group
    if hasattr(p, "ds_id"):
        raise RuntimeError("a ZeRO-3 parameter without a ZeRO-3 optimizer (or frozen): no fp32 master to follow")
    return p.detach().reshape(-1), 0, True, None


class PartitionedEMA:
    """EMA of ``module``'s fp32 master weights, this rank's partition only (see the module docstring).

    Keys are ``module.named_parameters()`` names; full tensors have the parameters' shapes, dtype float32.
    Initialised from the current masters (``ema_0 = θ_0``). Construct it on every rank after
    ``deepspeed.initialize`` (the fragments exist only then).
    """

    def __init__(self, module: torch.nn.Module, engine=None):
        del engine  # the parameters carry their DeepSpeed mappings; kept for call-site symmetry
        self._params = dict(module.named_parameters())
        self._slots: list[_Slot] = []
        with torch.no_grad():
            for name, p in self._params.items():
                frag, start, replicated, group = _local_master(p)
                shape = p.ds_shape if hasattr(p, "ds_shape") else p.shape
                self._slots.append(_Slot(name, torch.Size(shape), start, frag.to(torch.float32, copy=True),
                                         replicated, group))

    # ------------------------------------------------------------------ sizes
    def names(self) -> list[str]:
        return [s.name for s in self._slots]

    def numel_local(self) -> int:
        """Elements stored on this rank (≈ numel_full / world under ZeRO; numel_full without DeepSpeed)."""
        return sum(s.ema.numel() for s in self._slots)

    def numel_full(self) -> int:
        return sum(s.shape.numel() for s in self._slots)

    def layout(self) -> dict[str, tuple[int, int, int]]:
        """``{name: (start, local numel, full numel)}``: where this rank's fragment sits in each flattened parameter."""
        return {s.name: (s.start, s.ema.numel(), s.shape.numel()) for s in self._slots}

    # ------------------------------------------------------------------ hot path
    @torch.no_grad()
    def update(self, decay: float) -> None:
        """``ema ← decay·ema + (1 − decay)·master`` on this rank's fragments; local, no collective."""
        for slot in self._slots:
            frag, start, _, _ = _local_master(self._params[slot.name])
            if frag.numel() != slot.ema.numel() or start != slot.start:
                raise RuntimeError(f"EMA of {slot.name}: the fp32 master fragment moved ({start}+{frag.numel()}, "
                                   f"was {slot.start}+{slot.ema.numel()}); the partitioning changed after init")
            slot.ema.mul_(decay).add_(frag.to(slot.ema.device, torch.float32), alpha=1 - decay)

    # ------------------------------------------------------------------ gather / scatter
    def iter_full(self, device=None) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield ``(name, full fp32 tensor)`` per parameter, on ``device`` (default: where the EMA lives).

        Collective under ZeRO: every rank must exhaust the iterator (same order on every rank). With NCCL ``device``
        must be this rank's GPU. One full parameter is materialised at a time.
        """
        for slot in self._slots:
            dev = torch.device(device) if device is not None else slot.ema.device
            if slot.replicated:
                yield slot.name, slot.ema.to(dev, copy=True).view(slot.shape)
                continue
            buf = torch.zeros(slot.shape.numel(), dtype=torch.float32, device=dev)
            buf.narrow(0, slot.start, slot.ema.numel()).copy_(slot.ema)
            torch.distributed.all_reduce(buf, group=slot.group)  # fragments are disjoint: the sum assembles them
            yield slot.name, buf.view(slot.shape)

    def full_state_dict(self, *, rank: int | None = None, device=None) -> dict[str, torch.Tensor]:
        """Full fp32 CPU tensors, ``{name: tensor}`` (the ``ema_dit.safetensors`` layout).

        Collective under ZeRO: every rank calls it. ``rank=None``: every rank gets the dict; ``rank=r``: only global
        rank ``r`` keeps it (the others get ``{}`` and hold no full copy). ``device`` is where each parameter is
        assembled before it moves to the host (with NCCL: this rank's GPU).
        """
        me = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        keep = rank is None or rank == me
        out = {}
        for name, full in self.iter_full(device):
            if keep:
                out[name] = full.to("cpu", copy=True)
        return out

    @torch.no_grad()
    def load_full_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Set the EMA from full tensors (e.g. ``ema_dit.safetensors``): each rank slices its own fragments out.

        Local, no collective. Every parameter must be present with its full shape; extra keys (buffers) are ignored.
        """
        missing = [s.name for s in self._slots if s.name not in state]
        if missing:
            raise KeyError(f"EMA state lacks {len(missing)} parameter(s), e.g. {missing[:3]}")
        for slot in self._slots:
            full = state[slot.name]
            if tuple(full.shape) != tuple(slot.shape):
                raise ValueError(f"EMA state {slot.name}: shape {tuple(full.shape)}, expected {tuple(slot.shape)}")
            piece = full.reshape(-1).narrow(0, slot.start, slot.ema.numel())
            slot.ema.copy_(piece.to(slot.ema.device, torch.float32))
