"""`Conditioning`: what the DiT needs from a batch of prompts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch


@dataclass
class Conditioning:
    """DiT conditioning for B prompts.

    prompt_embeds: (B, L, joint_attention_dim) -> DiT ``encoder_hidden_states``. L is the same for every prompt
        (max_prompt_tokens + num_queries), so conditionings from different batches concatenate.
    pooled_embeds: (B, pooled_projection_dim) -> DiT ``pooled_projections``.
    """

    prompt_embeds: torch.Tensor
    pooled_embeds: torch.Tensor

    def __post_init__(self) -> None:
        if self.prompt_embeds.shape[0] != self.pooled_embeds.shape[0]:
            raise ValueError(f"batch mismatch: prompt_embeds {tuple(self.prompt_embeds.shape)} vs pooled_embeds "
                             f"{tuple(self.pooled_embeds.shape)}")

    def __len__(self) -> int:
        return self.prompt_embeds.shape[0]

    def to(self, device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> "Conditioning":
        return Conditioning(self.prompt_embeds.to(device=device, dtype=dtype),
                            self.pooled_embeds.to(device=device, dtype=dtype))

    def index_select(self, idx: torch.Tensor | Sequence[int]) -> "Conditioning":
        idx = torch.as_tensor(idx, dtype=torch.long, device=self.prompt_embeds.device).reshape(-1)
        return Conditioning(self.prompt_embeds.index_select(0, idx), self.pooled_embeds.index_select(0, idx))

    def __getitem__(self, idx: int | slice | torch.Tensor | Sequence[int]) -> "Conditioning":
        """Batch indexing; an int keeps the batch dimension (returns a conditioning of length 1)."""
        if isinstance(idx, int):
            idx = slice(idx, idx + 1) if idx != -1 else slice(-1, None)
        if isinstance(idx, slice):
            return Conditioning(self.prompt_embeds[idx], self.pooled_embeds[idx])
        return self.index_select(idx)

    def repeat_interleave(self, n: int) -> "Conditioning":
        """Each prompt n times in a row: [a, b] -> [a]*n + [b]*n (the rollout group layout)."""
        return Conditioning(self.prompt_embeds.repeat_interleave(n, dim=0),
                            self.pooled_embeds.repeat_interleave(n, dim=0))

    @classmethod
    def cat(cls, items: Sequence["Conditioning"]) -> "Conditioning":
        if not items:
            raise ValueError("Conditioning.cat needs at least one item")
        return cls(torch.cat([c.prompt_embeds for c in items]), torch.cat([c.pooled_embeds for c in items]))
