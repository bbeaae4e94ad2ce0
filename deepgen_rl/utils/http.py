"""Shared HTTP client plumbing: image encoding and a bounded-retry JSON POST (httpx only: no torch, so the
standalone UniGenBench judge can use it).

Retry policy (one place, used by every client: the OCR / remote / VLM / UnifiedReward rewards and the UniGenBench
judge): retry only on transport errors (connection refused/reset, timeouts),
HTTP 429 and HTTP 5xx, at most ``max_retries`` times, sleeping ``min(backoff_s * 2**attempt, max_backoff_s)`` (or the
server's ``Retry-After`` in seconds on 429, capped the same way, when it is a finite number >= 0; a missing, negative,
NaN, infinite or non-numeric ``Retry-After`` falls back to the backoff). Any other status (4xx) fails at once:
resending the same request cannot fix it. The final failure is raised as :class:`RequestFailed`; callers turn it into
``valid=False``.
"""
from __future__ import annotations

import base64
import io
import logging
import math
import os
import time
from typing import Any

import httpx

logger = logging.getLogger(__name__)


class RequestFailed(RuntimeError):
    """A request that still failed after the allowed retries (or failed with a non-retryable status)."""

    def __init__(self, message: str, *, attempts: int, status_code: int | None = None):
        super().__init__(message)
        self.attempts = attempts
        self.status_code = status_code


def image_to_base64(image, fmt: str = "PNG") -> str:
    """Encode a PIL image as base64 ``fmt`` (PNG: lossless, fast compression; JPEG: quality 95)."""
    buffer = io.BytesIO()
    image = image.convert("RGB")
    if fmt.upper() == "PNG":
        image.save(buffer, format="PNG", compress_level=1)
    elif fmt.upper() in ("JPEG", "JPG"):
        image.save(buffer, format="JPEG", quality=95)
    else:
        raise ValueError(f"unsupported image format {fmt!r} (PNG or JPEG)")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def image_to_data_url(image, fmt: str = "PNG") -> str:
    mime = "image/png" if fmt.upper() == "PNG" else "image/jpeg"
    return f"data:{mime};base64,{image_to_base64(image, fmt)}"


def bearer_headers(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def _is_retryable_status(code: int) -> bool:
    return code == 429 or 500 <= code <= 599


def _parse_retry_after(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header, or None unless it is a finite number >= 0 (HTTP dates are ignored)."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def post_json_with_retries(
    client: httpx.Client,
    url: str,
    payload: dict[str, Any],
    *,
    headers: dict[str, str] | None = None,
    timeout_s: float,
    max_retries: int,
    backoff_s: float,
    max_backoff_s: float = 30.0,
) -> tuple[Any, int]:
    """POST ``payload`` as JSON; return (decoded JSON body, attempts used) or raise :class:`RequestFailed`."""
    attempts = 0
    while True:
        attempts += 1
        retry_after: float | None = None
        try:
            response = client.post(url, json=payload, headers=headers, timeout=timeout_s)
        except httpx.TransportError as exc:  # connect errors, timeouts, broken connections
            error, status = f"{type(exc).__name__}: {exc}", None
        else:
            if response.status_code < 300:
                try:
                    return response.json(), attempts
                except ValueError as exc:
                    raise RequestFailed(f"{url}: response is not JSON: {exc}", attempts=attempts) from exc
            status = response.status_code
            error = f"HTTP {status}: {response.text[:300]}"
            if not _is_retryable_status(status):
                raise RequestFailed(f"{url}: {error}", attempts=attempts, status_code=status)
            if status == 429:
                retry_after = _parse_retry_after(response.headers.get("retry-after"))
        if attempts > max_retries:
            raise RequestFailed(f"{url}: {error} (gave up after {attempts} attempts)", attempts=attempts,
                                status_code=status)
        delay = min(retry_after if retry_after is not None else backoff_s * 2 ** (attempts - 1), max_backoff_s)
        logger.warning("%s: %s; retry %d/%d in %.2fs", url, error, attempts, max_retries, delay)
        time.sleep(delay)


class JsonServiceClient:
    """The HTTP side of a service-backed reward: one thread-safe ``httpx.Client``, the bearer token
    (``token`` or ``$REWARD_API_TOKEN``) and the retry policy above, shared by the OCR and judge clients.

    Proxies from the environment are ignored unless ``trust_env`` (reward services live next to the trainer, and a
    cluster-wide HTTP_PROXY would otherwise swallow localhost calls).
    """

    def __init__(self, *, timeout_s: float, max_retries: int, backoff_s: float, max_backoff_s: float,
                 token: str | None, trust_env: bool, max_connections: int):
        if max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        self.timeout_s, self.max_retries = timeout_s, max_retries
        self.backoff_s, self.max_backoff_s = backoff_s, max_backoff_s
        self.headers = bearer_headers(token if token is not None else os.environ.get("REWARD_API_TOKEN"))
        self.client = httpx.Client(trust_env=trust_env, limits=httpx.Limits(max_connections=max_connections))

    def post(self, url: str, payload: Any) -> tuple[Any, int]:
        """POST ``payload`` as JSON with retries: (decoded JSON body, attempts); raises :class:`RequestFailed`."""
        return post_json_with_retries(self.client, url, payload, headers=self.headers, timeout_s=self.timeout_s,
                                      max_retries=self.max_retries, backoff_s=self.backoff_s,
                                      max_backoff_s=self.max_backoff_s)
