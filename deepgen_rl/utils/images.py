"""Latents -> images helpers shared by rollout, evaluation and the quickstart (no model import: duck-typed)."""

from __future__ import annotations

import torch
from PIL import Image


def latents_to_pil(images: torch.Tensor) -> list[Image.Image]:
    """(B,3,H,W) in [0,1] (any float dtype, any device) -> list of B RGB PIL images (uint8, rounded)."""
    arr = (images.detach().float().clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()
    return [Image.fromarray(a) for a in arr]


VAE_DECODE_CHUNK = 8  # images per VAE decode call: 32 images at 512² decode at once peaks at ~13-21 GB


def decode_latents_chunked(model, latents: torch.Tensor, chunk: int = VAE_DECODE_CHUNK) -> torch.Tensor:
    """``model.decode_latents`` over ``chunk`` latents at a time: (B,16,h,w) -> fp32 (B,3,8h,8w) in [0, 1].

    Every image is decoded on its own (the VAE has no cross-sample op), so the result is the one-call decode's;
    the activation peak is that of ``chunk`` images.
    """
    if chunk <= 0 or latents.shape[0] <= chunk:
        return model.decode_latents(latents)
    return torch.cat([model.decode_latents(part) for part in latents.split(chunk)])
