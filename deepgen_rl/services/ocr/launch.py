"""Start the OCR service in a subprocess and wait until it answers /health (used by tests and bench)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import httpx


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServiceProcess:
    """A service started as ``argv`` in a subprocess, waited for until ``url``/health answers 200; a context manager.

    ``env`` is the child's environment; the child imports this very checkout of deepgen_rl (PYTHONPATH), whatever its
    working directory. ``what`` names the service in errors.
    """

    what = "service"
    stop_timeout_s = 10.0

    def __init__(self, argv: list[str], env: dict[str, str], url: str, *, startup_timeout_s: float,
                 log_path: str | None):
        package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
        self.env = {**env, "PYTHONPATH": os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))}
        self.argv, self.url = argv, url
        self.startup_timeout_s, self.log_path = startup_timeout_s, log_path
        self.process: subprocess.Popen | None = None

    def start(self):
        log = open(self.log_path, "wb") if self.log_path else subprocess.DEVNULL
        self.process = subprocess.Popen(self.argv, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.what} exited with code {self.process.returncode} (log: {self.log_path})")
            try:
                if httpx.get(f"{self.url}/health", timeout=1.0).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        self.stop()
        raise TimeoutError(f"{self.what} did not answer {self.url}/health within {self.startup_timeout_s}s")

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout_s: float | None = None) -> int | None:
        """SIGTERM, then SIGKILL after ``timeout_s`` (default ``stop_timeout_s``); the exit code (None if never
        started)."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=self.stop_timeout_s if timeout_s is None else timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return None if self.process is None else self.process.returncode

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class OcrServiceProcess(ServiceProcess):
    """``with OcrServiceProcess(env={"OCR_THREADS": "2"}) as svc: svc.url`` -- a real service on a free port."""

    what = "OCR service"

    def __init__(self, env: dict[str, str] | None = None, port: int | None = None, startup_timeout_s: float = 60.0,
                 log_path: str | None = None):
        self.port = port or free_port()
        super().__init__([sys.executable, "-m", "deepgen_rl.services.ocr.app", "--log-level", "warning"],
                         {**os.environ, **(env or {}), "OCR_HOST": "127.0.0.1", "OCR_PORT": str(self.port)},
                         f"http://127.0.0.1:{self.port}", startup_timeout_s=startup_timeout_s, log_path=log_path)


def render_text_image(lines: str | list[str], size: tuple[int, int] = (384, 384), font_size: int = 40):
    """Black text on white rendered by Pillow's built-in font (offline), one line per entry (tests and bench)."""
    from PIL import Image, ImageDraw, ImageFont

    lines = [lines] if isinstance(lines, str) else lines
    image = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(image)
    font = ImageFont.load_default(size=font_size)
    y = max(8, (size[1] - len(lines) * int(font_size * 1.5)) // 2)
    for line in lines:
        draw.text((16, y), line, fill="black", font=font)
        y += int(font_size * 1.5)
    return image
