"""Scoring threads fed by one queue: micro-batching across requests and data parallelism across reward replicas.

A request's images to score are cut into chunks (at most ``chunk_size`` images each) and put on one shared queue.
Each scoring thread owns one scorer replica (the same object for every thread on CPU; one per device with
``--devices cuda:0,cuda:1``) and repeatedly takes a chunk, then -- when micro-batching -- more queued chunks until
``max_batch`` images or ``batch_wait_ms`` have passed, scores them in ONE reward call and hands each chunk its
slice of the results. Rewards are batch-size invariant (tested per reward), so coalescing never changes a score.

A scorer is any object with ``score_batch(images, prompts, metadata) -> list[ImageResult]`` (one per image).
"""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

logger = logging.getLogger("deepgen_rl.reward_server")


@dataclass
class ImageResult:
    """One image's outcome: a finite ``score``, or ``score=None`` with an ``error`` (failure) or without one
    (nothing to score, e.g. a prompt without target text). ``extras`` are extra per-image response fields."""

    score: float | None
    error: str | None = None
    extras: dict[str, Any] = field(default_factory=dict)


def describe(exc: BaseException) -> str:
    message = str(exc).strip()
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


@dataclass
class _Chunk:
    images: list
    prompts: list[str]
    metadata: list[dict]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future


class ScoringPool:
    """``await pool.score(images, prompts, metadata)`` -> list[ImageResult]; scoring runs on the pool's threads."""

    def __init__(self, replicas: Sequence[Any], *, chunk_size: int, max_batch: int, batch_wait_ms: float = 0.0,
                 micro_batch: bool = True):
        if not replicas or chunk_size < 1 or max_batch < 1:
            raise ValueError("need >= 1 replica, chunk_size >= 1 and max_batch >= 1")
        self.chunk_size, self.max_batch = chunk_size, max_batch
        self.batch_wait_s, self.micro_batch = batch_wait_ms / 1000.0, micro_batch
        self.queue: queue.Queue[_Chunk | None] = queue.Queue()
        self.calls = 0  # reward calls made (a coalesced micro-batch is one call)
        self.largest_batch = 0
        self._lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, args=(replica,), daemon=True, name=f"reward-{k}")
                        for k, replica in enumerate(replicas)]
        for thread in self.threads:
            thread.start()

    async def score(self, images: list, prompts: list[str], metadata: list[dict]) -> list[ImageResult]:
        loop = asyncio.get_running_loop()
        futures = []
        for start in range(0, len(images), self.chunk_size):
            stop = start + self.chunk_size
            future = loop.create_future()
            self.queue.put(_Chunk(images[start:stop], prompts[start:stop], metadata[start:stop], loop, future))
            futures.append(future)
        results = await asyncio.gather(*futures)
        return [result for chunk in results for result in chunk]

    def close(self) -> None:
        for _ in self.threads:
            self.queue.put(None)

    def _take_batch(self, first: _Chunk) -> list[_Chunk]:
        batch, size = [first], len(first.images)
        if not self.micro_batch:
            return batch
        deadline = time.monotonic() + self.batch_wait_s
        while size < self.max_batch:
            try:
                remaining = deadline - time.monotonic()
                chunk = self.queue.get(timeout=remaining) if remaining > 0 else self.queue.get_nowait()
            except queue.Empty:
                break
            if chunk is None or size + len(chunk.images) > self.max_batch:
                self.queue.put(chunk)  # a stop signal or a chunk for the next call: leave it to another turn
                break
            batch.append(chunk)
            size += len(chunk.images)
        return batch

    def _run(self, replica) -> None:
        while True:
            first = self.queue.get()
            if first is None:
                return
            batch = self._take_batch(first)
            images = [img for chunk in batch for img in chunk.images]
            prompts = [p for chunk in batch for p in chunk.prompts]
            metadata = [m for chunk in batch for m in chunk.metadata]
            try:
                results = list(replica.score_batch(images, prompts, metadata))
                if len(results) != len(images):
                    raise RuntimeError(f"scorer returned {len(results)} results for {len(images)} images")
            except Exception as exc:  # noqa: BLE001 - a failed call fails its images, never the server
                logger.warning("reward call on %d images failed: %s", len(images), describe(exc))
                results = [ImageResult(None, describe(exc)) for _ in images]
            with self._lock:
                self.calls += 1
                self.largest_batch = max(self.largest_batch, len(images))
            offset = 0
            for chunk in batch:
                part = results[offset:offset + len(chunk.images)]
                offset += len(chunk.images)
                try:
                    chunk.loop.call_soon_threadsafe(_resolve, chunk.future, part)
                except RuntimeError:  # the event loop is closed (server shutting down): nobody waits
                    pass


def _resolve(future: asyncio.Future, value) -> None:
    if not future.done():  # the request may have been cancelled (client gone, shutdown)
        future.set_result(value)
