"""OCR reward service (``python -m deepgen_rl.services.ocr.app`` or ``bash scripts/reward_ocr.sh``): the reward server
(:mod:`deepgen_rl.services.reward`) hosting the in-process ``ocr_local`` reward, configured by ``OCR_*`` env vars.

Endpoints (API and limits in docs/rewards.md):
  GET  /health -> {"status": "ok", "pid", "threads", "max_images", "rewards"} (no auth)
  GET  /stats  -> per-process counters (requests, images received, images OCR'd, images whose OCR failed, rejected
                  requests)
  POST /score  {"images": [base64 PNG/JPEG], "prompts": [str]}
               -> {"scores": [float|null], "texts": [str], "errors": [str|null]}

OCR runs on ``OCR_THREADS`` scoring threads, one image per reward call (RapidOCR is per-image), never on the event
loop. Only images whose prompt holds quoted target text are decoded and OCR'd; the others get score null, text "" and
error null. An image whose OCR or scoring raises (e.g. RapidOCR's ``ResizeImgError`` on a 1x4000 image) gets score
null, text "" and ``errors[i] = "<ExceptionType>: <message>"``; the other images of the request are scored as usual
(200). Any other unexpected exception answers 500 with the JSON body ``{"error": "internal error: <...>"}``.
"""
from __future__ import annotations

import argparse
import os

from fastapi import FastAPI

from deepgen_rl.services.reward.app import RewardScorer
from deepgen_rl.services.reward.app import create_app as create_reward_app
from deepgen_rl.services.reward.protocol import serve

from . import engine
from .config import OcrServiceConfig


def create_app(config: OcrServiceConfig | None = None) -> FastAPI:
    from deepgen_rl.rewards import get_reward

    config = config or OcrServiceConfig.from_env()
    engine.set_onnxruntime_threads(config.ort_threads)
    # ocr_local.wants: only prompts with quoted target text are decoded and OCR'd; ``texts`` is returned
    scorer = RewardScorer(get_reward("ocr_local"), extra_fields={"texts": ""})
    return create_reward_app(config, {"ocr_local": [scorer] * max(1, config.threads)},
                             title="DeepGen-RL OCR reward service", stats_aliases={"images_ocr": "images_scored"},
                             micro_batch=False, chunk_size=1)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="DeepGen-RL OCR reward service (settings from OCR_* env vars)")
    parser.add_argument("--host", help="overrides OCR_HOST (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="overrides OCR_PORT (default 18082)")
    parser.add_argument("--workers", type=int, help="overrides OCR_WORKERS (uvicorn worker processes, default 1)")
    parser.add_argument("--log-level", default=os.environ.get("OCR_LOG_LEVEL", "info"))
    args = parser.parse_args(argv)
    # Worker processes rebuild the config from the environment, so CLI overrides go through it.
    for flag, env in (("host", "OCR_HOST"), ("port", "OCR_PORT"), ("workers", "OCR_WORKERS")):
        if getattr(args, flag) is not None:
            os.environ[env] = str(getattr(args, flag))
    config = OcrServiceConfig.from_env()
    status = serve("deepgen_rl.services.ocr.app:create_app", config, log_level=args.log_level)
    if status:
        raise SystemExit(status)


if __name__ == "__main__":
    main()
