"""``jpeg_compressibility`` / ``jpeg_incompressibility`` (DDPO): -/+ JPEG file size in kB at quality 95."""
from __future__ import annotations

import io

import torch

from .base import Reward, register_reward

JPEG_QUALITY = 95


def jpeg_size_kb(image, quality: int = JPEG_QUALITY) -> float:
    """Size in kB (1 kB = 1000 bytes) of the RGB image saved as JPEG at ``quality``."""
    buffer = io.BytesIO()
    image.convert("RGB").save(buffer, format="JPEG", quality=quality)
    return buffer.tell() / 1000.0


class _JpegSizeReward(Reward):
    sign = 1.0

    def score(self, images, prompts, metadata):
        scores = torch.tensor([self.sign * jpeg_size_kb(img) for img in images], dtype=torch.float32)
        return scores, torch.ones(len(images), dtype=torch.bool), {}


@register_reward("jpeg_compressibility")
class JpegCompressibilityReward(_JpegSizeReward):
    """score = -(JPEG size in kB at quality 95): smaller files score higher."""

    name = "jpeg_compressibility"
    sign = -1.0


@register_reward("jpeg_incompressibility")
class JpegIncompressibilityReward(_JpegSizeReward):
    """score = +(JPEG size in kB at quality 95): larger files score higher."""

    name = "jpeg_incompressibility"
    sign = 1.0
