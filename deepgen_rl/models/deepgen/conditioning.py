"""`Conditioning`: what the DiT needs from a batch of prompts, with the mask of its real text rows."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F


@dataclass
class Conditioning:
    """DiT conditioning for B prompts.

    prompt_embeds: (B, L, joint_attention_dim) -> DiT ``encoder_hidden_states``. Row b holds its prompt's
        n_b + num_queries real rows first, then pad rows (zeros) up to L = the longest prompt of the batch.
    pooled_embeds: (B, pooled_projection_dim) -> DiT ``pooled_projections``.
    text_mask: (B, L) bool, True = a real row; None = every row is real. ``predict_velocity`` masks the other rows
        as attention keys, so a prompt's velocity does not depend on how far its batch padded it.

    Every batch operation (``index_select``, ``[]``, ``repeat_interleave``, ``cat``, ``to``) carries the mask;
    ``cat`` right-pads shorter conditionings with zero, masked rows.
    """

    prompt_embeds: torch.Tensor
    pooled_embeds: torch.Tensor
    text_mask: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.prompt_embeds.shape[0] != self.pooled_embeds.shape[0]:
            raise ValueError(f"batch mismatch: prompt_embeds {tuple(self.prompt_embeds.shape)} vs pooled_embeds "
                             f"{tuple(self.pooled_embeds.shape)}")
        if self.text_mask is not None:
            if self.text_mask.shape != self.prompt_embeds.shape[:2]:
                raise ValueError(f"text_mask {tuple(self.text_mask.shape)} does not match prompt_embeds "
                                 f"{tuple(self.prompt_embeds.shape)} (expected (B, L))")
            if self.text_mask.dtype != torch.bool:
                self.text_mask = self.text_mask.to(torch.bool)

    def __len__(self) -> int:
        return self.prompt_embeds.shape[0]

    @property
    def mask(self) -> torch.Tensor:
        """(B, L) bool: ``text_mask`` or all True."""
        if self.text_mask is not None:
            return self.text_mask
        b, length = self.prompt_embeds.shape[:2]
        return torch.ones((b, length), dtype=torch.bool, device=self.prompt_embeds.device)

    def trimmed(self) -> "Conditioning":
        """Drop trailing columns that are pad for every row; mask None when every remaining row is real.

        Exact: masked key rows contribute nothing, so a velocity does not change; it only saves DiT FLOPs.
        """
        if self.text_mask is None:
            return self
        host = self.text_mask.cpu()  # the one host transfer (a small bool matrix), not three syncs
        real = host.any(dim=0).nonzero()
        length = int(real.max()) + 1 if len(real) else 0
        mask = self.text_mask[:, :length]
        return Conditioning(self.prompt_embeds[:, :length], self.pooled_embeds,
                            None if bool(host[:, :length].all()) else mask)

    def to(self, device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> "Conditioning":
        mask = None if self.text_mask is None else self.text_mask.to(device=device)
        return Conditioning(self.prompt_embeds.to(device=device, dtype=dtype),
                            self.pooled_embeds.to(device=device, dtype=dtype), mask)

    def index_select(self, idx: torch.Tensor | Sequence[int]) -> "Conditioning":
        idx = torch.as_tensor(idx, dtype=torch.long, device=self.prompt_embeds.device).reshape(-1)
        mask = None if self.text_mask is None else self.text_mask.index_select(0, idx.to(self.text_mask.device))
        return Conditioning(self.prompt_embeds.index_select(0, idx), self.pooled_embeds.index_select(0, idx), mask)

    def __getitem__(self, idx: int | slice | torch.Tensor | Sequence[int]) -> "Conditioning":
        """Batch indexing; an int keeps the batch dimension (returns a conditioning of length 1)."""
        if isinstance(idx, int):
            idx = slice(idx, idx + 1) if idx != -1 else slice(-1, None)
        if isinstance(idx, slice):
            mask = None if self.text_mask is None else self.text_mask[idx]
            return Conditioning(self.prompt_embeds[idx], self.pooled_embeds[idx], mask)
        return self.index_select(idx)

    def repeat_interleave(self, n: int) -> "Conditioning":
        """Each prompt n times in a row: [a, b] -> [a]*n + [b]*n (the rollout group layout)."""
        mask = None if self.text_mask is None else self.text_mask.repeat_interleave(n, dim=0)
        return Conditioning(self.prompt_embeds.repeat_interleave(n, dim=0),
                            self.pooled_embeds.repeat_interleave(n, dim=0), mask)

    @classmethod
    def cat(cls, items: Sequence["Conditioning"]) -> "Conditioning":
        """Concatenate on the batch; shorter items are right-padded with zero rows that their mask hides."""
        if not items:
            raise ValueError("Conditioning.cat needs at least one item")
        length = max(c.prompt_embeds.shape[1] for c in items)
        if all(c.text_mask is None and c.prompt_embeds.shape[1] == length for c in items):
            return cls(torch.cat([c.prompt_embeds for c in items]), torch.cat([c.pooled_embeds for c in items]))
        embeds, masks = [], []
        for c in items:
            pad = length - c.prompt_embeds.shape[1]
            embeds.append(F.pad(c.prompt_embeds, (0, 0, 0, pad)))
            masks.append(F.pad(c.mask.to(c.prompt_embeds.device), (0, pad), value=False))
        return cls(torch.cat(embeds), torch.cat([c.pooled_embeds for c in items]), torch.cat(masks))
