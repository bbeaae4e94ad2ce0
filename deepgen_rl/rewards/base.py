"""Reward interface, registry and output types.

A reward is a callable ``(images: list[PIL.Image], prompts: list[str], metadata: list[dict]) -> RewardOutput``.
Subclasses of :class:`Reward` implement :meth:`Reward.score`; ``__call__`` adds the bookkeeping every reward reports
(``latency_s``, ``num_scored``, ``num_failed``, ``num_skipped``) and checks shapes. Rewards are registered by name with
one decorator line (``@register_reward("name")``) and built with :func:`get_reward`.

Failure semantics: a sample a reward could not score has ``valid=False`` and score 0.0 -- the 0.0 is a placeholder
that must never enter statistics (the trainer masks with ``valid``). Rewards never invent a score for a failure.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
from PIL import Image

__all__ = [
    "RewardOutput",
    "MultiRewardOutput",
    "Reward",
    "register_reward",
    "get_reward",
    "available_rewards",
]


@dataclass
class RewardOutput:
    """Scores of one reward for N samples.

    scores: FloatTensor[N] (fp32); entries with ``valid=False`` are 0.0 placeholders.
    valid:  BoolTensor[N]; False where the sample could not be scored (failed request, no target text, ...).
    info:   per-call statistics; always holds latency_s, num_scored, num_failed, num_skipped.
    """

    scores: torch.Tensor
    valid: torch.Tensor
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.scores = torch.as_tensor(self.scores, dtype=torch.float32)
        self.valid = torch.as_tensor(self.valid, dtype=torch.bool)
        if self.scores.ndim != 1 or self.scores.shape != self.valid.shape:
            raise ValueError(f"scores {tuple(self.scores.shape)} and valid {tuple(self.valid.shape)} must be equal 1-D")
        # An invalid entry carries no information; keep its placeholder at exactly 0.
        self.scores = torch.where(self.valid, self.scores, torch.zeros_like(self.scores))


@dataclass
class MultiRewardOutput:
    """Scores of K rewards for N samples (column k = ``reward_names[k]``).

    scores: FloatTensor[N, K] fp32 (0.0 where invalid); valid: BoolTensor[N, K];
    info: {"per_reward": {name: reward info}, "latency_s": wall time of the whole call}.
    """

    scores: torch.Tensor
    valid: torch.Tensor
    info: dict[str, Any]


class Reward:
    """Base class. Subclasses implement :meth:`score` and must be safe to call from several threads at once."""

    name: str = "reward"

    def score(
        self, images: list[Image.Image], prompts: list[str], metadata: list[dict]
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
        """Return (scores FloatTensor[N], valid BoolTensor[N], extra info) for the given samples."""
        raise NotImplementedError

    def __call__(
        self, images: Sequence[Image.Image], prompts: Sequence[str], metadata: Sequence[dict] | None = None
    ) -> RewardOutput:
        images, prompts = list(images), list(prompts)
        metadata = [{} for _ in images] if metadata is None else list(metadata)
        if not (len(images) == len(prompts) == len(metadata)):
            raise ValueError(
                f"{self.name}: got {len(images)} images, {len(prompts)} prompts, {len(metadata)} metadata entries"
            )
        start = time.perf_counter()
        if images:
            scores, valid, extra = self.score(images, prompts, metadata)
        else:
            scores, valid, extra = torch.zeros(0), torch.zeros(0, dtype=torch.bool), {}
        out = RewardOutput(scores, valid, dict(extra))
        if out.scores.shape[0] != len(images):
            raise ValueError(f"{self.name}: returned {out.scores.shape[0]} scores for {len(images)} samples")
        finite = torch.isfinite(out.scores)
        if not bool(finite.all()):
            # A NaN/inf is a bug in the reward, not a score: drop it and say so.
            out.info["num_nonfinite"] = int((~finite & out.valid).sum())
            out.valid &= finite
            out.scores = torch.where(out.valid, out.scores, torch.zeros_like(out.scores))
        out.info.update(
            latency_s=time.perf_counter() - start,
            num_scored=int(out.valid.sum()),
            num_failed=int((~out.valid).sum()),
            num_skipped=0,
        )
        return out


_REGISTRY: dict[str, Callable[..., Reward]] = {}


def register_reward(name: str) -> Callable[[Callable[..., Reward]], Callable[..., Reward]]:
    """Class/factory decorator: ``@register_reward("brightness")`` makes ``get_reward("brightness", **kw)`` work."""

    def decorator(factory: Callable[..., Reward]) -> Callable[..., Reward]:
        if name in _REGISTRY and _REGISTRY[name] is not factory:
            raise ValueError(f"reward {name!r} is already registered by {_REGISTRY[name]!r}")
        _REGISTRY[name] = factory
        return factory

    return decorator


def get_reward(name: str, /, **kwargs: Any) -> Reward:
    """Build the reward registered as ``name`` with ``kwargs`` passed to its constructor.

    ``remote_url`` in ``kwargs`` builds the ``remote`` client instead, scoring ``name`` on the reward server at that
    url (the other kwargs go to the client: batch_size, timeout_s, max_retries, token, ...). So
    ``--reward_kwargs '{"pickscore": {"remote_url": "http://host:18090"}}'`` moves a reward to a server by
    configuration; its column keeps the name ``pickscore``.
    """
    if name not in _REGISTRY:
        raise KeyError(f"unknown reward {name!r}; available: {', '.join(available_rewards())}")
    remote = _REGISTRY.get("remote")
    if "remote_url" in kwargs and isinstance(_REGISTRY[name], type) and remote is not None and \
            issubclass(_REGISTRY[name], remote):  # already a client (ocr): remote_url is its url
        kwargs = dict(kwargs)
        kwargs["url"] = kwargs.pop("remote_url")
    elif "remote_url" in kwargs:
        kwargs = dict(kwargs)
        url = kwargs.pop("remote_url")
        reward = _REGISTRY["remote"](url=url, name=kwargs.pop("remote_name", name), **kwargs)
        reward.name = name
        return reward
    reward = _REGISTRY[name](**kwargs)
    reward.name = name
    return reward


def available_rewards() -> list[str]:
    return sorted(_REGISTRY)


def is_finite_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
