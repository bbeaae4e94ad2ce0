"""OCR service settings: the reward server's settings read from ``OCR_*`` env vars (documented in docs/rewards.md),
plus ``OCR_ORT_THREADS`` (onnxruntime intra-op threads per engine, -1: onnxruntime default)."""
from __future__ import annotations

from dataclasses import dataclass

from deepgen_rl.services.reward.config import ServiceConfig


@dataclass(frozen=True)
class OcrServiceConfig(ServiceConfig):
    env_prefix: str = "OCR_"
    port: int = 18082
    threads: int = 2  # OCR threads per worker process (each owns one RapidOCR engine)
    ort_threads: int = -1

    @classmethod
    def from_env(cls, env_prefix: str = "OCR_", **defaults) -> "OcrServiceConfig":
        return super().from_env(env_prefix, **defaults)
