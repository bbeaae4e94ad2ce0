"""Reward interface, registry and output types.

A reward is a callable ``(images: list[PIL.Image], prompts: list[str], metadata: list[dict]) -> RewardOutput``.
Subclasses of :class:`Reward` implement :meth:`Reward.score`; ``__call__`` adds the bookkeeping every reward reports
(``latency_s``, ``num_scored``, ``num_failed``, ``num_skipped``) and checks shapes. Rewards are registered by name with
one decorator line (``@register_reward("name")``) and built with :func:`get_reward`.

Failure semantics: a sample a reward could not score has ``valid=False`` and score 0.0 -- the 0.0 is a placeholder
that must never enter statistics (the trainer masks with ``valid``). Rewards never invent a score for a failure.
"""
from __future__ import annotations

import inspect
import math
import os
import re
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
    "WeightPath",
    "preflight_reward",
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


@dataclass(frozen=True)
class WeightPath:
    """A weights location a reward reads: constructor kwarg, env var fallbacks (first set wins), and what must exist.

    kind: ``"file"`` (an existing file: a .pt/.pth/.safetensors), ``"path"`` (an existing file or directory), or
    ``"model"`` (an existing path, or a hub id ``org/name`` that ``from_pretrained`` resolves later).
    """

    kwarg: str
    env_vars: tuple[str, ...]
    kind: str = "model"
    required: bool = True


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class Reward:
    """Base class. Subclasses implement :meth:`score` and must be safe to call from several threads at once."""

    name: str = "reward"
    weight_paths: tuple[WeightPath, ...] = ()  # what :meth:`preflight` checks without loading anything

    def wants(self, prompt: str, meta: dict) -> bool:
        """False when this sample will certainly come back ``valid=False`` with no error (nothing to score: OCR
        without quoted text, GenEval without metadata or template). Cheap, no image needed: the reward server does
        not even decode such images. The contract test checks that ``wants() == False`` implies ``valid=False``."""
        return True

    @classmethod
    def preflight(cls, **kwargs: Any) -> None:
        """Check ``kwargs`` against the constructor and every :attr:`weight_paths` entry without loading weights;
        ValueError naming the kwarg, its env vars and the value. (The reward server's parent runs this before
        starting several workers, which each build the reward.)"""
        try:
            inspect.signature(cls).bind(**kwargs)
        except TypeError as exc:
            raise ValueError(f"{cls.name}: --reward_kwargs {sorted(kwargs)} do not fit {cls.__name__}"
                             f"{inspect.signature(cls)}: {exc}") from None
        for wp in cls.weight_paths:
            source = f"{wp.kwarg} in --reward_kwargs or ${' / $'.join(wp.env_vars)}"
            value = kwargs.get(wp.kwarg) or next((os.environ[e] for e in wp.env_vars if os.environ.get(e)), None)
            if not value:
                if wp.required:
                    raise ValueError(f"{cls.name}: no {wp.kwarg} given; set {source}")
                continue
            value = str(value)
            ok = {"file": os.path.isfile(value), "path": os.path.exists(value),
                  "model": os.path.exists(value) or bool(_HUB_ID.match(value))}[wp.kind]
            if not ok:
                expected = {"file": "an existing file", "path": "an existing file or directory",
                            "model": "an existing directory or a hub id org/name"}[wp.kind]
                raise ValueError(f"{cls.name}: {wp.kwarg} = {value!r} ({source}) is not {expected}")

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


def preflight_reward(name: str, /, **kwargs: Any) -> None:
    """Cheap check that ``get_reward(name, **kwargs)`` can build (registered, kwargs fit, weights paths exist),
    loading nothing; ValueError saying what to fix. A ``remote_url`` reward is only checked for its name."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown reward {name!r}; available: {', '.join(available_rewards())}")
    factory = _REGISTRY[name]
    if "remote_url" in kwargs:
        return
    if isinstance(factory, type) and issubclass(factory, Reward):
        factory.preflight(**kwargs)
        return
    try:
        inspect.signature(factory).bind(**kwargs)
    except TypeError as exc:
        raise ValueError(f"{name}: --reward_kwargs {sorted(kwargs)} do not fit {factory!r}: {exc}") from None


def available_rewards() -> list[str]:
    return sorted(_REGISTRY)


def is_finite_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
