"""Rewards: ``Reward`` interface, ``get_reward(name, **kwargs)`` registry, ``compute_weighted_rewards``.

Adding a reward = one module here with ``@register_reward("name")`` on its class, plus its import below.
Heavy dependencies (transformers, HTTP clients' services) are imported inside the reward, not at package import.
"""
from .base import MultiRewardOutput, Reward, RewardOutput, available_rewards, get_reward, register_reward
from .combine import compute_weighted_rewards

# One line per reward module: importing it registers its name(s).
from . import brightness, clip_sim, color_target, jpeg, ocr, unifiedreward  # noqa: E402,F401
from . import (aesthetic, geneval, hpsv2, imagereward, ocr_local, ocr_vlm, pickscore, remote,  # noqa: E402,F401,I001
               unifiedreward_pointwise)
from . import toy_compositional  # noqa: E402,F401

__all__ = [
    "MultiRewardOutput",
    "Reward",
    "RewardOutput",
    "available_rewards",
    "compute_weighted_rewards",
    "get_reward",
    "register_reward",
]
