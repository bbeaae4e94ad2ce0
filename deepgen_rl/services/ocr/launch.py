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


class OcrServiceProcess:
    """``with OcrServiceProcess(env={"OCR_THREADS": "2"}) as svc: svc.url`` -- a real service on a free port."""

    def __init__(self, env: dict[str, str] | None = None, port: int | None = None, startup_timeout_s: float = 60.0,
                 log_path: str | None = None):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {**os.environ, **(env or {}), "OCR_HOST": "127.0.0.1", "OCR_PORT": str(self.port)}
        # Make the child import this very checkout of deepgen_rl, whatever its working directory.
        package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
        self.env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, self.env.get("PYTHONPATH")]))
        self.startup_timeout_s = startup_timeout_s
        self.log_path = log_path
        self.process: subprocess.Popen | None = None

    def start(self) -> "OcrServiceProcess":
        log = open(self.log_path, "wb") if self.log_path else subprocess.DEVNULL
        self.process = subprocess.Popen(
            [sys.executable, "-m", "deepgen_rl.services.ocr.app", "--log-level", "warning"],
            env=self.env, stdout=log, stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"OCR service exited with code {self.process.returncode} (log: {self.log_path})")
            try:
                if httpx.get(f"{self.url}/health", timeout=1.0).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        self.stop()
        raise TimeoutError(f"OCR service did not answer {self.url}/health within {self.startup_timeout_s}s")

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def __enter__(self) -> "OcrServiceProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


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
