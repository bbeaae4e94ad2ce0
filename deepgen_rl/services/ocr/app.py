"""FastAPI OCR reward service (``python -m deepgen_rl.services.ocr.app`` or ``bash scripts/reward_ocr.sh``).

Endpoints (API and limits in docs/rewards.md):
  GET  /health -> {"status": "ok", "pid", "threads", "max_images"} (no auth)
  GET  /stats  -> per-process counters (requests, images received, images OCR'd, images whose OCR failed, rejected
                  requests)
  POST /score  {"images": [base64 PNG/JPEG], "prompts": [str]}
               -> {"scores": [float|null], "texts": [str], "errors": [str|null]}

Parsing/decoding and OCR run in worker threads (OCR in a dedicated pool of ``OCR_THREADS``), never on the event loop.
Only images whose prompt holds quoted target text are OCR'd; the others get score null, text "" and error null.
An image whose OCR or scoring raises (e.g. RapidOCR's ``ResizeImgError`` on a 1x4000 image) gets score null, text ""
and ``errors[i] = "<ExceptionType>: <message>"``; the other images of the request are scored as usual (200). Any other
unexpected exception answers 500 with the JSON body ``{"error": "internal error: <ExceptionType>: <message>"}``.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import hmac
import logging
import os
from concurrent.futures import ThreadPoolExecutor

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from . import engine
from .config import OcrServiceConfig
from .scoring import extract_target_texts, ocr_score
from .validation import ApiError, parse_score_request

logger = logging.getLogger("deepgen_rl.ocr_service")


def create_app(config: OcrServiceConfig | None = None) -> FastAPI:
    config = config or OcrServiceConfig.from_env()
    engine.set_onnxruntime_threads(config.ort_threads)
    executor = ThreadPoolExecutor(max_workers=max(1, config.threads), thread_name_prefix="ocr")
    # Mutated only on the event-loop thread, so no lock is needed.
    stats = {"requests": 0, "requests_rejected": 0, "images_received": 0, "images_ocr": 0, "images_failed": 0,
             "pending_images": 0}

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        executor.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title="DeepGen-RL OCR reward service", lifespan=lifespan)

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        stats["requests_rejected"] += 1
        headers = {"Retry-After": "1"} if exc.status_code == 429 else None
        headers = {"WWW-Authenticate": "Bearer"} if exc.status_code == 401 else headers
        return JSONResponse({"error": exc.message}, status_code=exc.status_code, headers=headers)

    @app.exception_handler(Exception)
    async def _internal_error(request: Request, exc: Exception) -> JSONResponse:
        # Starlette's ServerErrorMiddleware sends this body, then re-raises so that uvicorn still logs the traceback.
        return JSONResponse({"error": f"internal error: {_describe(exc)}"}, status_code=500)

    def check_token(request: Request) -> None:
        if config.token is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), config.token.encode()):
            raise ApiError(401, "missing or wrong bearer token (REWARD_API_TOKEN is set on the server)")

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "pid": os.getpid(), "threads": config.threads, "max_images": config.max_images}

    @app.get("/stats")
    async def get_stats(request: Request) -> dict:
        check_token(request)
        return {"pid": os.getpid(), **stats}

    @app.post("/score")
    async def score(request: Request) -> dict:
        check_token(request)
        content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if content_type != "application/json":
            raise ApiError(415, f"Content-Type must be application/json, got {content_type or 'none'!r}")
        body = await _read_body(request, config.max_body_bytes)
        parsed = await run_in_threadpool(parse_score_request, body, config)
        stats["requests"] += 1
        stats["images_received"] += len(parsed.images)
        todo = [i for i, prompt in enumerate(parsed.prompts) if extract_target_texts(prompt)]
        if stats["pending_images"] + len(todo) > config.max_pending_images and stats["pending_images"] > 0:
            raise ApiError(429, f"busy: {stats['pending_images']} images pending (OCR_MAX_PENDING_IMAGES)")
        stats["pending_images"] += len(todo)
        try:
            loop = asyncio.get_running_loop()
            results = await asyncio.gather(
                *(loop.run_in_executor(executor, recognize_and_score, parsed.images[i], parsed.prompts[i]) for i in todo)
            )
        finally:
            stats["pending_images"] -= len(todo)
        stats["images_ocr"] += len(todo)
        scores: list[float | None] = [None] * len(parsed.images)
        texts = [""] * len(parsed.images)
        errors: list[str | None] = [None] * len(parsed.images)
        for i, (text, value, error) in zip(todo, results):
            texts[i], scores[i], errors[i] = text, value, error
            if error is not None:
                stats["images_failed"] += 1
                logger.warning("OCR of images[%d] (%dx%d) failed: %s", i, *parsed.images[i].size, error)
        return {"scores": scores, "texts": texts, "errors": errors}

    return app


def _describe(exc: BaseException) -> str:
    message = str(exc).strip()
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def recognize_and_score(image, prompt: str) -> tuple[str, float | None, str | None]:
    """OCR ``image`` and score it against ``prompt`` (runs in the OCR pool: both steps are CPU-bound).

    Returns (text, score, None), or ("", None, "<ExceptionType>: <message>") when OCR or scoring raises for this image
    (RapidOCR does on extreme aspect ratios such as 1x4000), so one odd image never fails the whole request.
    """
    try:
        text = engine.recognize_text(image)
        return text, ocr_score(prompt, text), None
    except Exception as exc:  # noqa: BLE001 - any per-image failure becomes that image's error
        return "", None, _describe(exc)


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"body of {declared} bytes exceeds OCR_MAX_BODY_BYTES={limit}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(413, f"body exceeds OCR_MAX_BODY_BYTES={limit}")
        chunks.append(chunk)
    return b"".join(chunks)


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
    import uvicorn

    uvicorn.run(
        "deepgen_rl.services.ocr.app:create_app",
        factory=True,
        host=config.host,
        port=config.port,
        workers=config.workers,
        log_level=args.log_level,
    )


if __name__ == "__main__":
    main()
