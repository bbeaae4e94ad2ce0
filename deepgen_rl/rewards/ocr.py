"""``ocr``: client of the OCR reward service (deepgen_rl/services/ocr, ``bash scripts/reward_ocr.sh``).

Images are sent as base64 PNG in batches of at most ``batch_size`` (several batches in flight at once, up to
``max_concurrent_requests``). A batch whose request finally fails (see :mod:`deepgen_rl.rewards.http` for the retry
policy) marks its samples ``valid=False``; a null score (prompt without quoted target text) is ``valid=False`` too and
counted in ``info["no_target_text"]``. An image the service could not OCR (null score with a message in the
response's ``errors`` list, e.g. RapidOCR's ``ResizeImgError`` on a 1x4000 image) is ``valid=False`` alone -- the
other images of its batch keep their scores -- counted in ``info["image_failed"]`` with ``"images[i]: <message>"`` in
``info["errors"]``.
A response whose ``scores``, ``texts`` or ``errors`` list is not well-formed fails its whole batch. No failure ever
becomes a score.
"""
from __future__ import annotations

import logging
import os
from concurrent.futures import ThreadPoolExecutor

import torch

from .base import Reward, is_finite_number, register_reward
from .http import JsonServiceClient, RequestFailed, image_to_base64

logger = logging.getLogger(__name__)

DEFAULT_OCR_URL = "http://localhost:18082"


@register_reward("ocr")
class OcrReward(Reward):
    """Text-rendering accuracy in [0, 1] from the OCR service: 1 - Σ edit distance / Σ target length."""

    name = "ocr"

    def __init__(
        self,
        url: str | None = None,
        *,
        batch_size: int = 16,
        max_concurrent_requests: int = 4,
        timeout_s: float = 120.0,
        max_retries: int = 3,
        backoff_s: float = 1.0,
        max_backoff_s: float = 30.0,
        token: str | None = None,
        trust_env: bool = False,
    ):
        if batch_size < 1 or max_concurrent_requests < 1 or max_retries < 0:
            raise ValueError("batch_size and max_concurrent_requests must be >= 1, max_retries >= 0")
        self.url = (url or os.environ.get("OCR_URL") or DEFAULT_OCR_URL).rstrip("/")
        self.batch_size = batch_size
        self.max_concurrent_requests = max_concurrent_requests
        self.http = JsonServiceClient(timeout_s=timeout_s, max_retries=max_retries, backoff_s=backoff_s,
                                      max_backoff_s=max_backoff_s, token=token, trust_env=trust_env,
                                      max_connections=max(8, 2 * max_concurrent_requests))

    def _score_batch(self, images, prompts) -> dict:
        payload = {"images": [image_to_base64(img, "PNG") for img in images], "prompts": list(prompts)}
        body, attempts = self.http.post(f"{self.url}/score", payload)
        scores = body.get("scores") if isinstance(body, dict) else None
        if not isinstance(scores, list) or len(scores) != len(images):
            raise RequestFailed(f"{self.url}/score: malformed response (expected {len(images)} scores)",
                                attempts=attempts)
        for value in scores:
            if value is not None and not (is_finite_number(value) and 0.0 <= value <= 1.0):
                raise RequestFailed(f"{self.url}/score: score {value!r} is not null or a number in [0, 1]",
                                    attempts=attempts)
        texts = body.get("texts")
        if not isinstance(texts, list) or len(texts) != len(images) or \
                not all(text is None or isinstance(text, str) for text in texts):
            raise RequestFailed(f"{self.url}/score: malformed response ('texts' must be a list of {len(images)} "
                                f"strings or nulls, got {_shape(texts)})", attempts=attempts)
        # "errors" is optional (services before it existed omit it); when present it must match too.
        errors = body.get("errors", [None] * len(images))
        if not isinstance(errors, list) or len(errors) != len(images) or \
                not all(error is None or isinstance(error, str) for error in errors):
            raise RequestFailed(f"{self.url}/score: malformed response ('errors' must be a list of {len(images)} "
                                f"strings or nulls, got {_shape(errors)})", attempts=attempts)
        for i, (value, error) in enumerate(zip(scores, errors)):
            if error is not None and value is not None:
                raise RequestFailed(f"{self.url}/score: malformed response (images[{i}] has both score {value!r} "
                                    f"and error {error!r})", attempts=attempts)
        return {"scores": scores, "texts": texts, "errors": errors, "attempts": attempts}

    def score(self, images, prompts, metadata):
        n = len(images)
        scores = torch.zeros(n, dtype=torch.float32)
        valid = torch.zeros(n, dtype=torch.bool)
        info = {"no_target_text": 0, "image_failed": 0, "request_failed": 0, "requests": 0, "retries": 0, "errors": [],
                "texts": [""] * n}
        starts = list(range(0, n, self.batch_size))
        with ThreadPoolExecutor(max_workers=min(self.max_concurrent_requests, len(starts))) as pool:
            futures = [pool.submit(self._score_batch, images[s:s + self.batch_size], prompts[s:s + self.batch_size])
                       for s in starts]
            for start, future in zip(starts, futures):
                stop = min(start + self.batch_size, n)
                try:
                    result = future.result()
                except RequestFailed as exc:
                    logger.error("ocr reward: batch [%d:%d] failed: %s", start, stop, exc)
                    info["request_failed"] += stop - start
                    info["requests"] += exc.attempts
                    info["retries"] += exc.attempts - 1
                    info["errors"].append(str(exc))
                    continue
                info["requests"] += result["attempts"]
                info["retries"] += result["attempts"] - 1
                for offset, (value, text, error) in enumerate(zip(result["scores"], result["texts"],
                                                                  result["errors"])):
                    info["texts"][start + offset] = text or ""
                    if error is not None:
                        logger.warning("ocr reward: images[%d] could not be OCR'd: %s", start + offset, error)
                        info["image_failed"] += 1
                        info["errors"].append(f"images[{start + offset}]: {error}")
                    elif value is None:
                        info["no_target_text"] += 1
                    else:
                        scores[start + offset], valid[start + offset] = float(value), True
        return scores, valid, info


def _shape(value) -> str:
    if isinstance(value, list):
        kinds = sorted({type(item).__name__ for item in value})
        return f"a list of {len(value)} ({', '.join(kinds) or 'empty'})"
    return type(value).__name__
