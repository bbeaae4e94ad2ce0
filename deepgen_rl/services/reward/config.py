"""Reward-server settings, read from ``<PREFIX>*`` environment variables (``REWARD_`` for the generic server,
``OCR_`` for the OCR service; documented in docs/rewards.md). Worker processes rebuild the config from the
environment, so the command line writes its overrides there."""
from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "").strip()
    try:
        return int(value) if value else default
    except ValueError as exc:
        raise ValueError(f"{name} must be an integer, got {value!r}") from exc


def _env_float(name: str, default: float) -> float:
    value = os.environ.get(name, "").strip()
    try:
        return float(value) if value else default
    except ValueError as exc:
        raise ValueError(f"{name} must be a number, got {value!r}") from exc


@dataclass(frozen=True)
class ServiceConfig:
    """Limits and timeouts of one reward server (``env_prefix`` names its env vars in error messages)."""

    env_prefix: str = "REWARD_"
    host: str = "127.0.0.1"
    port: int = 18090
    workers: int = 1  # uvicorn worker processes (each loads its own reward replicas)
    threads: int = 2  # scoring threads per process (one reward replica each when devices are given)
    max_images: int = 64  # per request
    max_image_bytes: int = 8 * 1024 * 1024  # encoded bytes of one image
    max_image_pixels: int = 4096 * 4096  # width * height of one image (from its header)
    max_request_pixels: int = 64 * 1024 * 1024  # sum of width * height of the images a request asks to score
    max_body_bytes: int = 256 * 1024 * 1024  # whole request body
    max_prompt_chars: int = 4096
    max_metadata_chars: int = 65536  # JSON text of one metadata entry
    max_json_depth: int = 32  # nesting of the request body
    max_pending_images: int = 1024  # images queued or running in this process before answering 429
    max_batch: int = 32  # images per reward call (micro-batch)
    batch_wait_ms: float = 0.0  # how long a scoring thread waits to fill a micro-batch (0: take what is queued)
    header_timeout_s: float = 10.0  # a connection must send complete request headers within this
    body_timeout_s: float = 60.0  # a request must send its whole body within this (else 408)
    keep_alive_s: float = 5.0  # idle keep-alive connections are closed after this
    graceful_shutdown_s: float = 10.0  # on SIGTERM, requests still running after this are cancelled
    token: str | None = None  # REWARD_API_TOKEN: bearer token required on /score, /stats (docs are off when set)

    def env(self, name: str) -> str:
        return f"{self.env_prefix}{name.upper()}"

    @classmethod
    def from_env(cls, env_prefix: str = "REWARD_", **defaults) -> "ServiceConfig":
        """Defaults (``defaults`` override the class defaults) overridden by ``<env_prefix><FIELD>`` env vars."""
        base = replace(cls(env_prefix=env_prefix), **defaults)
        values = {}
        for f in fields(cls):
            if f.name in ("env_prefix", "token"):
                continue
            name = f"{env_prefix}{f.name.upper()}"
            current = getattr(base, f.name)
            if isinstance(current, bool) or isinstance(current, str):
                values[f.name] = os.environ.get(name, current)
            elif isinstance(current, int):
                values[f.name] = _env_int(name, current)
            else:
                values[f.name] = _env_float(name, current)
        return replace(base, **values, token=os.environ.get("REWARD_API_TOKEN") or None)
