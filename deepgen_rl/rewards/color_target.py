"""``color_target``: how close the image's mean colour is to a target RGB colour (toy reward for CPU demos/tests)."""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from .base import Reward, register_reward
from .brightness import mean_rgb


@register_reward("color_target")
class ColorTargetReward(Reward):
    """score = 1 - mean_c |mean_rgb(image)_c - target_c|, in [0, 1]; ``target`` is RGB in [0, 1] (default red)."""

    name = "color_target"

    def __init__(self, target: Sequence[float] = (1.0, 0.0, 0.0)):
        target = np.asarray(target, dtype=np.float64)
        if target.shape != (3,) or not np.all((target >= 0) & (target <= 1)):
            raise ValueError(f"color_target: target must be 3 values in [0, 1], got {target.tolist()}")
        self.target = target

    def score(self, images, prompts, metadata):
        scores = [1.0 - float(np.abs(mean_rgb(img) - self.target).mean()) for img in images]
        return torch.tensor(scores, dtype=torch.float32), torch.ones(len(images), dtype=torch.bool), {}
