"""The per-(micro-batch, timestep) policy loss of one GRPO update: prepares the piece and calls the objective.

Which loss is taken is ``--atrain_algorithm``, looked up in the one table :data:`deepgen_rl.rl.objectives.OBJECTIVES`
(flowgrpo, grpoguard, diffusionnft; formulas in :mod:`deepgen_rl.rl.objectives` and :mod:`deepgen_rl.rl.losses`).
Inputs are explicit: a frozen :class:`~deepgen_rl.rl.objectives.PieceInputs` built once per update, the rollout
batch, the advantages and the piece's indices; the trainer is never passed.

Statistics stay on the device: a piece returns them as :class:`PieceStats` (no host copy), the update sums them in
:class:`UpdateStats` and copies the sums to the host once, at its end (docs/training.md#precision).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from deepgen_rl.models.deepgen.model import guided_velocity
from deepgen_rl.rl.objectives import OBJECTIVES, Piece, PieceInputs

__all__ = ["PieceInputs", "PieceStats", "UpdateStats", "make_piece", "policy_piece_loss", "update_indices"]


def update_indices(global_advantages: torch.Tensor, rank: int, n: int, tol: float | None) -> list[int]:
    """The local images (of ``n`` per rank) one policy update runs its forwards on.

    ``tol`` None: all of them. Otherwise the images with |A| > ``tol`` (``--skip_zero_advantage``): under the
    clipped-ratio objectives with β = 0 an image's loss is A·(ratio term), so an image with A = 0 adds exactly
    nothing to the gradient and one with |A| ≤ tol adds at most tol times what a unit-advantage image adds. The loss
    scale keeps dividing by ``n``, so the gradient is the full update's.

    Every rank must run the same number of pieces (ZeRO's gathers and the per-piece finiteness check are
    collectives), so each rank keeps as many images as the rank with the most kept images, padding with its own
    skipped images in index order; and at least one, so the update still has a backward at the accumulation
    boundary. ``global_advantages`` is the gathered (world·n,) tensor every rank holds, so no collective is needed.
    """
    if tol is None:
        return list(range(n))
    world = global_advantages.numel() // n
    keep = (global_advantages.detach().abs().reshape(world, n) > tol).cpu()
    target = max(1, int(keep.sum(1).max()))
    mine = keep[rank]
    kept = mine.nonzero().flatten().tolist()
    pad = (~mine).nonzero().flatten().tolist()[:target - len(kept)]
    return sorted(kept + pad)


class PieceStats(Mapping):
    """A piece's statistics: ``names`` and ``tensor``, (K,) fp32 on the device, one value per name.

    Read as a mapping (``stats["kl"]``, ``.items()``) it copies all K values to the host in ONE transfer, as Python
    floats, and keeps them; the trainer reads ``tensor`` instead, so a piece costs no transfer.
    """

    def __init__(self, names: tuple[str, ...], tensor: torch.Tensor):
        self.names, self.tensor = tuple(names), tensor
        self._floats: dict[str, float] | None = None

    def _host(self) -> dict[str, float]:
        if self._floats is None:
            self._floats = dict(zip(self.names, self.tensor.tolist()))
        return self._floats

    def __getitem__(self, key: str) -> float:
        return self._host()[key]

    def __contains__(self, key) -> bool:
        return key in self.names

    def __iter__(self):
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)


class UpdateStats:
    """The statistics of one policy update, summed on the device in float64; :meth:`to_host` copies them ONCE.

    The arithmetic is the host's float64 arithmetic in the same order (the sums equal the per-piece-float sums the
    trainer used to take), only the transfers are gone.
    """

    def __init__(self):
        self._sums: dict[str, torch.Tensor] = {}

    @staticmethod
    def _values(stats: Mapping) -> tuple[tuple[str, ...], torch.Tensor]:
        if isinstance(stats, PieceStats):
            return stats.names, stats.tensor.double()
        # a plain dict (a stand-in piece loss): floats or 0-d tensors
        return tuple(stats), torch.stack([torch.as_tensor(v, dtype=torch.float64).reshape(()) for v in stats.values()])

    def add(self, stats: Mapping, count: int, total: int, steps: int) -> None:
        """sums[k] += stats[k] · count / total / steps (a piece's share: its images of ``total``, one of ``steps``)."""
        if not stats:
            return
        names, values = self._values(stats)
        weighted = values * count / total / steps
        for i, k in enumerate(names):
            self._sums[k] = self._sums.get(k, torch.zeros((), dtype=torch.float64, device=values.device)) + weighted[i]

    def running_max(self, key: str, stats: Mapping, source: str) -> None:
        """sums[key] = max(sums[key] (0 at first), stats[source] (0 if absent)), with Python ``max``'s tie rule."""
        if source in stats:
            names, values = self._values(stats)
            new = values[names.index(source)]
        else:
            new = torch.zeros((), dtype=torch.float64)
        cur = self._sums.get(key)
        if cur is None:
            cur = torch.zeros((), dtype=torch.float64, device=new.device)
        self._sums[key] = torch.where(new > cur, new, cur)

    def set(self, key: str, value: torch.Tensor) -> None:
        self._sums[key] = value.detach().double().reshape(())

    def to_host(self) -> dict[str, float]:
        """Every sum as a Python float: ONE device-to-host transfer (none when nothing was recorded)."""
        if not self._sums:
            return {}
        keys = list(self._sums)
        return dict(zip(keys, torch.stack([self._sums[k] for k in keys]).tolist()))


def make_piece(inputs: PieceInputs, batch, advantages: torch.Tensor, mb: list[int], j: int) -> Piece:
    """Images ``mb`` (row indices of ``batch``) at trained step ``j``: their conditioning, σ, σ' and advantages."""
    dev = inputs.device
    idx = torch.tensor(mb, dtype=torch.long)
    cond = batch.cond.index_select(batch.cond_index[idx].to(dev))
    sig, sig_next = float(batch.sigmas[j]), float(batch.sigmas[j + 1])  # host tensor (RolloutBatch): no sync
    b = len(mb)

    def velocity(x, transformer):
        sigma = torch.full((b,), sig, device=dev)
        return guided_velocity(inputs.model, x.to(inputs.dtype), sigma, cond, batch.uncond, inputs.cfg_scale,
                               transformer)

    return Piece(batch=batch, mb=mb, j=j, idx=idx, sig=sig, sig_next=sig_next, adv=advantages[idx].to(dev),
                 velocity=velocity)


def policy_piece_loss(inputs: PieceInputs, batch, advantages: torch.Tensor, mb: list[int], j: int):
    """Loss (scalar, differentiable w.r.t. the DiT) and the :class:`PieceStats` of images ``mb`` at step ``j``.

    The stats stay on the device (one stacked (K,) fp32 tensor); nothing is copied to the host here.
    """
    loss, stats = OBJECTIVES[inputs.algorithm].piece_loss(inputs, make_piece(inputs, batch, advantages, mb, j))
    values = torch.stack([torch.as_tensor(v).float().reshape(()).to(inputs.device) for v in stats.values()])
    return loss, PieceStats(tuple(stats), values)
