"""The per-(micro-batch, timestep) policy loss of one GRPO update: prepares the piece and calls the objective.

Which loss is taken is ``--atrain_algorithm``, looked up in the one table :data:`deepgen_rl.rl.objectives.OBJECTIVES`
(flowgrpo, grpoguard, diffusionnft; formulas in :mod:`deepgen_rl.rl.objectives` and :mod:`deepgen_rl.rl.losses`).
Inputs are explicit: a frozen :class:`~deepgen_rl.rl.objectives.PieceInputs` built once per update, the rollout
batch, the advantages and the piece's indices; the trainer is never passed.
"""

from __future__ import annotations

import torch

from deepgen_rl.models.deepgen.model import guided_velocity
from deepgen_rl.rl.objectives import OBJECTIVES, Piece, PieceInputs

__all__ = ["PieceInputs", "make_piece", "policy_piece_loss"]


def make_piece(inputs: PieceInputs, batch, advantages: torch.Tensor, mb: list[int], j: int) -> Piece:
    """Images ``mb`` (row indices of ``batch``) at trained step ``j``: their conditioning, σ, σ' and advantages."""
    dev = inputs.device
    idx = torch.tensor(mb, dtype=torch.long)
    cond = batch.cond.index_select(batch.cond_index[idx].to(dev))
    sig, sig_next = float(batch.sigmas[j]), float(batch.sigmas[j + 1])
    b = len(mb)

    def velocity(x, transformer):
        sigma = torch.full((b,), sig, device=dev)
        return guided_velocity(inputs.model, x.to(inputs.dtype), sigma, cond, batch.uncond, inputs.cfg_scale,
                               transformer)

    return Piece(batch=batch, mb=mb, j=j, idx=idx, sig=sig, sig_next=sig_next, adv=advantages[idx].to(dev),
                 velocity=velocity)


def policy_piece_loss(inputs: PieceInputs, batch, advantages: torch.Tensor, mb: list[int], j: int):
    """Loss (scalar, differentiable w.r.t. the DiT) and float stats for images ``mb`` at step ``j``.

    The stats are computed as device tensors and copied to the host in one transfer at the end.
    """
    loss, stats = OBJECTIVES[inputs.algorithm].piece_loss(inputs, make_piece(inputs, batch, advantages, mb, j))
    # ONE host copy for all the piece's statistics (each float() of a device tensor would wait for the device)
    values = torch.stack([torch.as_tensor(v).float().reshape(()).to(inputs.device)
                          for v in stats.values()]).tolist()
    return loss, dict(zip(stats, values))
