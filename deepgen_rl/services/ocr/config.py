"""OCR service settings, read once from the environment (documented in docs/rewards.md)."""
from __future__ import annotations

import os
from dataclasses import dataclass


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "").strip()
    try:
        return int(value) if value else default
    except ValueError as exc:
        raise ValueError(f"{name} must be an integer, got {value!r}") from exc


@dataclass(frozen=True)
class OcrServiceConfig:
    host: str = "127.0.0.1"
    port: int = 18082
    workers: int = 1  # uvicorn worker processes
    threads: int = 2  # OCR threads per worker process (each owns one RapidOCR engine)
    ort_threads: int = -1  # onnxruntime intra-op threads per engine (-1: onnxruntime default)
    max_images: int = 64  # per request
    max_image_bytes: int = 8 * 1024 * 1024  # decoded bytes of one image
    max_image_pixels: int = 4096 * 4096  # width * height of one image
    max_body_bytes: int = 256 * 1024 * 1024  # whole request body
    max_prompt_chars: int = 4096
    max_pending_images: int = 1024  # images queued or running in this process before answering 429
    token: str | None = None  # REWARD_API_TOKEN: bearer token required on /score and /stats when set

    @classmethod
    def from_env(cls) -> "OcrServiceConfig":
        return cls(
            host=os.environ.get("OCR_HOST", cls.host),
            port=_env_int("OCR_PORT", cls.port),
            workers=_env_int("OCR_WORKERS", cls.workers),
            threads=_env_int("OCR_THREADS", cls.threads),
            ort_threads=_env_int("OCR_ORT_THREADS", cls.ort_threads),
            max_images=_env_int("OCR_MAX_IMAGES", cls.max_images),
            max_image_bytes=_env_int("OCR_MAX_IMAGE_BYTES", cls.max_image_bytes),
            max_image_pixels=_env_int("OCR_MAX_IMAGE_PIXELS", cls.max_image_pixels),
            max_body_bytes=_env_int("OCR_MAX_BODY_BYTES", cls.max_body_bytes),
            max_prompt_chars=_env_int("OCR_MAX_PROMPT_CHARS", cls.max_prompt_chars),
            max_pending_images=_env_int("OCR_MAX_PENDING_IMAGES", cls.max_pending_images),
            token=os.environ.get("REWARD_API_TOKEN") or None,
        )
