"""``remote``: any reward served by the reward server (``python -m deepgen_rl.services.reward --reward NAME``).

``get_reward("remote", url="http://127.0.0.1:18090", name="pickscore")`` -- or, keeping the reward's own name,
``--reward_kwargs '{"pickscore": {"remote_url": "http://127.0.0.1:18090"}}'`` -- scores through
``POST {url}/score/{name}`` (``{url}/score`` when ``name`` is None). The score and range are those of the served
reward. Images go as base64 PNG in batches of at most ``batch_size`` (up to ``max_concurrent_requests`` in flight),
with each sample's JSON-serialisable metadata (non-JSON values are dropped).

Failure semantics (the OCR client's, which is this class with OCR's defaults): a batch whose request finally fails
(retry policy: :mod:`deepgen_rl.utils.http`) or whose response is malformed marks its samples ``valid=False``
(``info["request_failed"]``); an image with a null score and an error string is ``valid=False`` alone
(``info["image_failed"]``, ``"images[i]: <message>"`` in ``info["errors"]``); a null score without an error (nothing
to score) is ``valid=False`` counted in ``info[null_counter]``. No failure ever becomes a score.
"""
from __future__ import annotations

import json
import logging
import math
from concurrent.futures import ThreadPoolExecutor

import torch

from .base import Reward, is_finite_number, register_reward
from deepgen_rl.utils.http import JsonServiceClient, RequestFailed, image_to_base64

logger = logging.getLogger(__name__)


def _jsonable(meta: dict) -> dict:
    out = {}
    for key, value in meta.items():
        try:
            json.dumps(value, allow_nan=False)
        except (TypeError, ValueError):
            continue
        out[str(key)] = value
    return out


def _shape(value) -> str:
    if isinstance(value, list):
        kinds = sorted({type(item).__name__ for item in value})
        return f"a list of {len(value)} ({', '.join(kinds) or 'empty'})"
    return type(value).__name__


@register_reward("remote")
class RemoteReward(Reward):
    """Scores of a reward hosted by a reward server; ``score_range`` (lo, hi) rejects out-of-range answers."""

    name = "remote"
    null_counter = "skipped"  # info key counting null scores without an error
    extra_fields: tuple[str, ...] = ()  # per-image string fields the response must carry (OCR: "texts")
    send_metadata = True

    def __init__(self, url: str | None = None, name: str | None = None, *, batch_size: int = 16,
                 max_concurrent_requests: int = 4, timeout_s: float = 120.0, max_retries: int = 3,
                 backoff_s: float = 1.0, max_backoff_s: float = 30.0, token: str | None = None,
                 trust_env: bool = False, score_range: tuple[float, float] | None = None):
        if batch_size < 1 or max_concurrent_requests < 1 or max_retries < 0:
            raise ValueError("batch_size and max_concurrent_requests must be >= 1, max_retries >= 0")
        if not url:
            raise ValueError("remote: no server url; pass url=... (or remote_url in --reward_kwargs)")
        self.url = url.rstrip("/")
        self.endpoint = f"{self.url}/score/{name}" if name else f"{self.url}/score"
        self.batch_size = batch_size
        self.max_concurrent_requests = max_concurrent_requests
        self.score_range = tuple(score_range) if score_range is not None else None
        self.http = JsonServiceClient(timeout_s=timeout_s, max_retries=max_retries, backoff_s=backoff_s,
                                      max_backoff_s=max_backoff_s, token=token, trust_env=trust_env,
                                      max_connections=max(8, 2 * max_concurrent_requests))

    def _payload(self, images, prompts, metadata) -> dict:
        payload = {"images": [image_to_base64(img, "PNG") for img in images], "prompts": list(prompts)}
        if self.send_metadata:
            payload["metadata"] = [_jsonable(m) for m in metadata]
        return payload

    def _check_list(self, body: dict, key: str, n: int, attempts: int, default=None) -> list:
        values = body.get(key, default)
        if not isinstance(values, list) or len(values) != n or \
                not all(value is None or isinstance(value, str) for value in values):
            raise RequestFailed(f"{self.endpoint}: malformed response ('{key}' must be a list of {n} strings or "
                                f"nulls, got {_shape(values)})", attempts=attempts)
        return values

    def _score_batch(self, images, prompts, metadata) -> dict:
        body, attempts = self.http.post(self.endpoint, self._payload(images, prompts, metadata))
        n = len(images)
        scores = body.get("scores") if isinstance(body, dict) else None
        if not isinstance(scores, list) or len(scores) != n:
            raise RequestFailed(f"{self.endpoint}: malformed response (expected {n} scores)", attempts=attempts)
        for value in scores:
            if value is None:
                continue
            lo, hi = self.score_range if self.score_range is not None else (-math.inf, math.inf)
            if not (is_finite_number(value) and lo <= value <= hi):
                expected = "a finite number" if self.score_range is None else f"a number in [{lo:g}, {hi:g}]"
                raise RequestFailed(f"{self.endpoint}: score {value!r} is not null or {expected}", attempts=attempts)
        extras = {key: self._check_list(body, key, n, attempts) for key in self.extra_fields}
        # "errors" is optional (services before it existed omit it); when present it must match too.
        errors = self._check_list(body, "errors", n, attempts, default=[None] * n)
        for i, (value, error) in enumerate(zip(scores, errors)):
            if error is not None and value is not None:
                raise RequestFailed(f"{self.endpoint}: malformed response (images[{i}] has both score {value!r} "
                                    f"and error {error!r})", attempts=attempts)
        return {"scores": scores, "errors": errors, "extras": extras, "attempts": attempts}

    def score(self, images, prompts, metadata):
        n = len(images)
        scores = torch.zeros(n, dtype=torch.float32)
        valid = torch.zeros(n, dtype=torch.bool)
        info = {self.null_counter: 0, "image_failed": 0, "request_failed": 0, "requests": 0, "retries": 0,
                "errors": [], **{key: [""] * n for key in self.extra_fields}}
        starts = list(range(0, n, self.batch_size))
        with ThreadPoolExecutor(max_workers=min(self.max_concurrent_requests, len(starts))) as pool:
            futures = [pool.submit(self._score_batch, images[s:s + self.batch_size], prompts[s:s + self.batch_size],
                                   metadata[s:s + self.batch_size]) for s in starts]
            for start, future in zip(starts, futures):
                stop = min(start + self.batch_size, n)
                try:
                    result = future.result()
                except RequestFailed as exc:
                    logger.error("%s reward: batch [%d:%d] failed: %s", self.name, start, stop, exc)
                    info["request_failed"] += stop - start
                    info["requests"] += exc.attempts
                    info["retries"] += exc.attempts - 1
                    info["errors"].append(str(exc))
                    continue
                info["requests"] += result["attempts"]
                info["retries"] += result["attempts"] - 1
                for offset, (value, error) in enumerate(zip(result["scores"], result["errors"])):
                    for key in self.extra_fields:
                        info[key][start + offset] = result["extras"][key][offset] or ""
                    if error is not None:
                        logger.warning("%s reward: images[%d] could not be scored: %s", self.name, start + offset,
                                       error)
                        info["image_failed"] += 1
                        info["errors"].append(f"images[{start + offset}]: {error}")
                    elif value is None:
                        info[self.null_counter] += 1
                    else:
                        scores[start + offset], valid[start + offset] = float(value), True
        return scores, valid, info
