"""uvicorn's h11 protocol with a header-read timeout, and ``serve`` (uvicorn with every timeout of the config).

uvicorn times out idle keep-alive connections but not a connection that sends part of its request headers and
stops: without this, such connections are held forever. :class:`TimedH11Protocol` closes a connection whose request
headers are not complete ``header_timeout_s`` after its first byte (or after it opened). The body is bounded by the
app's ``body_timeout_s`` (408), so no partial request outlives its timeouts and SIGTERM shutdown (which waits for
running requests, at most ``graceful_shutdown_s``) is never blocked by one.
"""
from __future__ import annotations

import logging
import os

from uvicorn.config import STARTUP_FAILURE
from uvicorn.protocols.http.h11_impl import H11Protocol

logger = logging.getLogger("deepgen_rl.reward_server")

HEADER_TIMEOUT_ENV = "DEEPGEN_REWARD_HEADER_TIMEOUT_S"  # set by serve(): worker processes read it


class TimedH11Protocol(H11Protocol):
    """H11Protocol that closes connections whose request headers do not arrive in time (one log line each)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.header_timeout_s = float(os.environ.get(HEADER_TIMEOUT_ENV, "10"))
        self._header_timer = None

    def _waiting_for_request(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def _arm(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout_s, self._on_header_timeout)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        waiting = self._waiting_for_request()
        super().data_received(data)
        if not self._waiting_for_request():
            self._disarm()  # headers complete: a request is running (the app bounds its body read)
        elif waiting and data:
            self._arm()  # bytes of the next request arrived: its headers must be complete in time

    def on_response_complete(self) -> None:
        self._disarm()
        super().on_response_complete()  # arms uvicorn's keep-alive timer; data_received re-arms ours

    def connection_lost(self, exc) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _on_header_timeout(self) -> None:
        self._header_timer = None
        if self._waiting_for_request() and not self.transport.is_closing():
            prefix = "%s:%d" % self.client if self.client else "?"
            logger.warning("client %s: request headers not complete within %.1fs; closing the connection", prefix,
                           self.header_timeout_s)
            self.transport.close()


def serve(app, config, *, log_level: str = "info") -> int:
    """Run ``app`` with uvicorn, the timeouts of ``config`` and its workers; the exit status (0, or
    ``STARTUP_FAILURE`` when the server or a worker could not start).

    ``app`` is an ASGI app (one process: it is served as it is, nothing is built again) or a ``module:factory``
    string, required for ``config.workers > 1`` (each worker calls the factory).
    """
    import uvicorn
    from uvicorn.supervisors import Multiprocess

    os.environ[HEADER_TIMEOUT_ENV] = str(config.header_timeout_s)
    uconfig = uvicorn.Config(
        app,
        factory=isinstance(app, str),
        host=config.host,
        port=config.port,
        workers=config.workers,
        log_level=log_level,
        http=TimedH11Protocol,
        timeout_keep_alive=int(max(1, config.keep_alive_s)),
        timeout_graceful_shutdown=int(max(1, config.graceful_shutdown_s)),
    )
    if config.workers > 1:
        if not isinstance(app, str):
            raise ValueError(f"{config.env('workers')}={config.workers} needs the app as a 'module:factory' string")
        # uvicorn.run's multi-worker branch, keeping the supervisor to read its workers' exit codes
        supervisor = Multiprocess(uconfig, sockets=[uconfig.bind_socket()])
        supervisor.run()
        return STARTUP_FAILURE if any(p.exitcode == STARTUP_FAILURE for p in supervisor.processes) else 0
    server = uvicorn.Server(uconfig)
    server.run()
    return 0 if server.started else STARTUP_FAILURE
