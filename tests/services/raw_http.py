"""Test helpers: an h11 client on ONE raw socket (a dropped connection shows, no client reconnects behind our back)
and a real uvicorn server (the reward server's protocol class) on a thread, for apps built in the test."""
from __future__ import annotations

import contextlib
import socket
import threading
import time

import h11


class H11Client:
    """Requests on one TCP connection; ``request`` fails (h11.LocalProtocolError) if the previous response said
    ``Connection: close``, and raises ConnectionError if the server closed instead of answering."""

    def __init__(self, port: int, timeout: float = 30.0):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.conn = h11.Connection(h11.CLIENT)

    def request(self, method: str, target: str, body: bytes = b"", headers=()) -> tuple[int, dict[str, str], bytes]:
        if self.conn.our_state is h11.DONE:
            self.conn.start_next_cycle()
        head = [("Host", "test"), ("Content-Length", str(len(body))), *headers]
        self.sock.sendall(self.conn.send(h11.Request(method=method, target=target, headers=head))
                          + self.conn.send(h11.Data(data=body)) + self.conn.send(h11.EndOfMessage()))
        response, chunks = None, []
        while True:
            event = self.conn.next_event()
            if event is h11.NEED_DATA:
                self.conn.receive_data(self.sock.recv(65536))
            elif isinstance(event, h11.ConnectionClosed):
                raise ConnectionError("the server closed the connection without answering")
            elif isinstance(event, h11.Response):
                response = event
            elif isinstance(event, h11.Data):
                chunks.append(event.data)
            elif isinstance(event, h11.EndOfMessage):
                break
        headers_out = {k.decode().lower(): v.decode() for k, v in response.headers}
        return response.status_code, headers_out, b"".join(chunks)

    def server_closed(self, timeout: float = 5.0) -> bool:
        """True when the server closes the connection within ``timeout`` (EOF), False if it stays open."""
        self.sock.settimeout(timeout)
        try:
            return self.sock.recv(1) == b""
        except socket.timeout:
            return False
        except ConnectionResetError:
            return True

    def close(self) -> None:
        self.sock.close()


@contextlib.contextmanager
def uvicorn_thread(app):
    """Serve ``app`` with uvicorn and :class:`TimedH11Protocol` on a free port in a thread; yields the port."""
    import uvicorn

    from deepgen_rl.services.ocr.launch import free_port
    from deepgen_rl.services.reward.protocol import TimedH11Protocol

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, http=TimedH11Protocol,
                                           log_level="warning", timeout_keep_alive=5))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.05)
    try:
        yield port
    finally:
        server.should_exit = True
        thread.join(timeout=15)
