"""``brightness``: mean pixel value of the RGB image in [0, 1] (a learnable toy reward for CPU demos and tests)."""
from __future__ import annotations

import numpy as np
import torch

from .base import Reward, register_reward


def mean_rgb(image) -> np.ndarray:
    """Mean of each RGB channel, float64[3] in [0, 1]."""
    pixels = np.asarray(image.convert("RGB"), dtype=np.float64) / 255.0
    return pixels.reshape(-1, 3).mean(axis=0)


@register_reward("brightness")
class BrightnessReward(Reward):
    """score = mean over pixels and RGB channels of pixel/255, in [0, 1]."""

    name = "brightness"

    def score(self, images, prompts, metadata):
        scores = torch.tensor([float(mean_rgb(img).mean()) for img in images], dtype=torch.float32)
        return scores, torch.ones(len(images), dtype=torch.bool), {}
