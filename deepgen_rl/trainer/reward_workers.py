"""Reward worker threads that never hold up the trainer's exit.

``concurrent.futures.ThreadPoolExecutor`` joins its (non-daemon) workers when the interpreter exits, so one reward
request stuck on a hung service (up to timeout x retries, minutes) kept a Ctrl-C'd trainer alive. These workers are
daemon threads: :meth:`shutdown` with ``wait=False`` cancels what has not started and returns at once, and the
interpreter exits without waiting for a request in flight (its result is never used).
"""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Future


class DaemonExecutor:
    """``submit(fn, *args) -> Future`` on ``max_workers`` daemon threads (the part of the executor API we use)."""

    def __init__(self, max_workers: int, thread_name_prefix: str = "worker"):
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._closed = False
        self._threads = [threading.Thread(target=self._work, name=f"{thread_name_prefix}_{i}", daemon=True)
                         for i in range(max(1, int(max_workers)))]
        for t in self._threads:
            t.start()

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            fut, fn, args, kwargs = item
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn(*args, **kwargs))
            except BaseException as e:  # the caller sees it through fut.result()
                fut.set_exception(e)

    def submit(self, fn, *args, **kwargs) -> Future:
        if self._closed:
            raise RuntimeError("submit after shutdown")
        fut: Future = Future()
        self._queue.put((fut, fn, args, kwargs))
        return fut

    def shutdown(self, wait: bool = True, cancel_futures: bool = False, timeout_s: float | None = None) -> None:
        """Stop the workers. ``cancel_futures``: queued work is cancelled; ``wait``: join each worker for at most
        ``timeout_s`` seconds (None: until done)."""
        self._closed = True
        if cancel_futures:
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    item[0].cancel()
        for _ in self._threads:
            self._queue.put(None)
        if wait:
            for t in self._threads:
                t.join(timeout_s)
