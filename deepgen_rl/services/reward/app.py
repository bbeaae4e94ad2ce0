"""FastAPI reward server: hosts registered in-process rewards behind one JSON protocol.

Endpoints (API and limits in docs/rewards.md):
  GET  /health -> {"status": "ok", "pid", "threads", "max_images", "rewards": [names]} (no auth)
  GET  /stats  -> per-process counters (requests, images received / scored / failed, rejected requests, reward calls)
  POST /score/{name}  {"images": [base64 PNG/JPEG], "prompts": [str], "metadata": [object] (optional)}
               -> {"scores": [float|null], "errors": [str|null], <reward's extra per-image fields>}
  POST /score  the same, when the server hosts exactly one reward

Per-image semantics: an image gets a number, or null with an error string (its scoring failed -- the rest of the
request is still scored, 200), or null without an error (the reward has nothing to score for it: ``Reward.wants`` is
False, e.g. a prompt without quoted text for OCR; such images are not even decoded). Bad input answers 4xx (see
``validation``); any other unexpected exception answers 500 with ``{"error": "internal error: <ExceptionType>:
<message>"}``. A 500 and a 408 (body timeout) send ``Connection: close`` and the server closes the connection after
them; every other 4xx keeps it alive (an unread body is discarded by uvicorn, bounded by the header timeout).
When a token is set, /score and /stats need ``Authorization: Bearer <token>`` and /docs, /openapi.json are off.
"""
from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import os
from typing import Any, Mapping, Sequence

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect

from .config import ServiceConfig
from .pool import ImageResult, ScoringPool, describe
from .validation import ApiError, parse_score_request

logger = logging.getLogger("deepgen_rl.reward_server")


class RewardScorer:
    """Adapts an in-process :class:`deepgen_rl.rewards.Reward` to the server.

    ``select`` picks the images worth decoding and scoring: those the reward ``wants`` (the others answer null
    without an error and are never decoded). ``score_batch`` calls the reward once:
    a valid sample becomes its score; an invalid one becomes null with ``info["image_errors"][i]`` as its error
    (null for "nothing to score") when the reward fills that list, else with ``"<name>: not scored (valid=False)"``.
    ``extra_fields`` maps a per-image list in the
    reward's info (e.g. OCR's ``texts``) to a response field with its default for unscored images.
    """

    def __init__(self, reward, *, extra_fields: Mapping[str, Any] | None = None):
        self.reward = reward
        self.name = reward.name
        self.extra_fields = dict(extra_fields or {})

    def select(self, prompts: Sequence[str], metadata: Sequence[dict]) -> list[int]:
        wants = getattr(self.reward, "wants", None)
        return [i for i, (p, m) in enumerate(zip(prompts, metadata)) if wants is None or wants(p, m)]

    def score_batch(self, images, prompts, metadata) -> list[ImageResult]:
        out = self.reward(images, prompts, metadata)
        # A reward that reports per-image errors marks "nothing to score" with valid=False and no error; for one that
        # does not, every invalid image is a failure.
        errors = out.info.get("image_errors")
        fallback = None if errors is not None else f"{self.name}: not scored (valid=False)"
        errors = errors if errors is not None else [None] * len(images)
        results = []
        for i in range(len(images)):
            extras = {key: (out.info.get(key) or [default] * len(images))[i] for key, default in
                      self.extra_fields.items()}
            if bool(out.valid[i]):
                results.append(ImageResult(float(out.scores[i]), None, extras))
            else:
                results.append(ImageResult(None, errors[i] or fallback, extras))
        return results


def create_app(config: ServiceConfig, scorers: Mapping[str, Sequence[RewardScorer]], *,
               title: str = "DeepGen-RL reward server", stats_aliases: Mapping[str, str] | None = None,
               micro_batch: bool = True, chunk_size: int | None = None) -> FastAPI:
    """App serving ``scorers`` ({reward name: replicas, one scoring thread each}).

    ``chunk_size`` (default ``config.max_batch``) cuts a request into queue items; ``micro_batch`` lets a thread
    coalesce queued items (of any request) into one reward call of at most ``config.max_batch`` images.
    ``stats_aliases`` adds copies of counters under other names (the OCR service's ``images_ocr``).
    """
    pools: dict[str, ScoringPool] = {}
    stats = {"requests": 0, "requests_rejected": 0, "images_received": 0, "images_scored": 0, "images_failed": 0,
             "pending_images": 0, "client_disconnects": 0}  # mutated only on the event-loop thread

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        for name, replicas in scorers.items():
            pools[name] = ScoringPool(replicas, chunk_size=chunk_size or config.max_batch, max_batch=config.max_batch,
                                      batch_wait_ms=config.batch_wait_ms, micro_batch=micro_batch)
        yield
        for pool in pools.values():
            pool.close()

    docs = {} if config.token is None else {"docs_url": None, "redoc_url": None, "openapi_url": None}
    app = FastAPI(title=title, lifespan=lifespan, **docs)

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        stats["requests_rejected"] += 1
        headers = {"Retry-After": "1"} if exc.status_code == 429 else {}
        if exc.status_code == 401:
            headers["WWW-Authenticate"] = "Bearer"
        if exc.close:  # a 408: the rest of the body may still come, so this connection cannot carry a next request
            headers["Connection"] = "close"
        return JSONResponse({"error": exc.message}, status_code=exc.status_code, headers=headers)

    @app.exception_handler(Exception)
    async def _internal_error(request: Request, exc: Exception) -> JSONResponse:
        # Starlette's ServerErrorMiddleware sends this body, then re-raises so that uvicorn still logs the traceback.
        return JSONResponse({"error": f"internal error: {describe(exc)}"}, status_code=500,
                            headers={"Connection": "close"})

    def check_token(request: Request) -> None:
        if config.token is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), config.token.encode()):
            raise ApiError(401, "missing or wrong bearer token (REWARD_API_TOKEN is set on the server)")

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "pid": os.getpid(), "threads": config.threads, "max_images": config.max_images,
                "rewards": sorted(scorers)}

    @app.get("/stats")
    async def get_stats(request: Request) -> dict:
        check_token(request)
        out = {"pid": os.getpid(), **stats,
               "reward_calls": sum(p.calls for p in pools.values()),
               "largest_batch": max([p.largest_batch for p in pools.values()] or [0])}
        for alias, key in (stats_aliases or {}).items():
            out[alias] = out[key]
        return out

    async def handle(request: Request, name: str) -> dict:
        check_token(request)
        content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if content_type != "application/json":
            raise ApiError(415, f"Content-Type must be application/json, got {content_type or 'none'!r}")
        body = await _read_body(request, config)
        if body is None:  # the client left mid-body: nobody to answer
            stats["client_disconnects"] += 1
            return JSONResponse({"error": "client disconnected"}, status_code=400)
        parsed = await run_in_threadpool(parse_score_request, body, config)
        scorer = scorers[name][0]
        stats["requests"] += 1
        stats["images_received"] += len(parsed.images)
        todo = scorer.select(parsed.prompts, parsed.metadata)
        if stats["pending_images"] + len(todo) > config.max_pending_images and stats["pending_images"] > 0:
            raise ApiError(429, f"busy: {stats['pending_images']} images pending ({config.env('max_pending_images')})")
        stats["pending_images"] += len(todo)
        try:
            images = await run_in_threadpool(parsed.decode, todo, config)
            results = await pools[name].score(images, [parsed.prompts[i] for i in todo],
                                              [parsed.metadata[i] for i in todo]) if todo else []
        finally:
            stats["pending_images"] -= len(todo)
        stats["images_scored"] += len(todo)
        n = len(parsed.images)
        response: dict[str, list] = {"scores": [None] * n, "errors": [None] * n}
        for key, default in scorer.extra_fields.items():
            response[key] = [default] * n
        for i, result in zip(todo, results):
            response["scores"][i], response["errors"][i] = result.score, result.error
            for key in scorer.extra_fields:
                if key in result.extras:
                    response[key][i] = result.extras[key]
            if result.error is not None:
                stats["images_failed"] += 1
                logger.warning("%s: images[%d] (%dx%d) failed: %s", name, i, *parsed.images[i].size, result.error)
        return response

    @app.post("/score/{name}")
    async def score_named(name: str, request: Request) -> dict:
        if name not in scorers:
            raise ApiError(404, f"no reward {name!r} on this server; it serves {sorted(scorers)}")
        return await handle(request, name)

    @app.post("/score")
    async def score(request: Request) -> dict:
        if len(scorers) != 1:
            raise ApiError(404, f"this server hosts {sorted(scorers)}: POST /score/<name>")
        return await handle(request, next(iter(scorers)))

    return app


async def _read_body(request: Request, config: ServiceConfig) -> bytes | None:
    """The body within ``max_body_bytes`` (413) and ``body_timeout_s`` (408); None if the client disconnected."""
    limit = config.max_body_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"body of {declared} bytes exceeds {config.env('max_body_bytes')}={limit}")
    chunks, size = [], 0
    stream = request.stream().__aiter__()
    deadline = asyncio.get_running_loop().time() + config.body_timeout_s
    while True:
        remaining = deadline - asyncio.get_running_loop().time()
        try:
            chunk = await asyncio.wait_for(stream.__anext__(), timeout=max(remaining, 0.001))
        except StopAsyncIteration:
            return b"".join(chunks)
        except (asyncio.TimeoutError, TimeoutError):
            logger.warning("client %s: body not received within %s=%ss; answering 408",
                           _peer(request), config.env("body_timeout_s"), config.body_timeout_s)
            raise ApiError(408, f"body not received within {config.env('body_timeout_s')}={config.body_timeout_s}s",
                           close=True) from None
        except ClientDisconnect:
            logger.warning("client %s disconnected after sending %d body bytes", _peer(request), size)
            return None
        size += len(chunk)
        if size > limit:
            raise ApiError(413, f"body exceeds {config.env('max_body_bytes')}={limit}")
        chunks.append(chunk)


def _peer(request: Request) -> str:
    client = request.client
    return f"{client.host}:{client.port}" if client else "?"
