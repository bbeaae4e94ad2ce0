"""A real HTTP server speaking OpenAI chat-completions about ONE image, answering deterministically (tests).

* Transcription requests (ocr_vlm): the answer is ``texts[rgb]`` for a solid image of colour ``rgb`` ("NONE" if
  unknown).
* Pointwise judging (unifiedreward): ``Alignment Score: 1 + 4·b`` (b = mean grey level in [0, 1], 2 decimals) and
  ``Style Score: 3``. The caption selects failure modes: "garbage" (no scores), "down" (always HTTP 500), "flaky"
  (500 on the first attempt of each caption), "outofrange" (alignment 7).
Every request is counted per caption.
"""
from __future__ import annotations

import base64
import io
import json
import re
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
from PIL import Image


def _image(data_url: str) -> Image.Image:
    return Image.open(io.BytesIO(base64.b64decode(data_url.split(",", 1)[1]))).convert("RGB")


def grey_level(image: Image.Image) -> float:
    return round(float(np.asarray(image.convert("L"), dtype=np.float64).mean() / 255.0), 2)


class FakeVlm:
    def __init__(self, texts: dict[tuple[int, int, int], str] | None = None):
        self.texts = texts or {}
        self.attempts: Counter = Counter()
        self.lock = threading.Lock()
        vlm = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                status, payload = vlm.respond(self.path, body)
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def respond(self, path: str, body: dict) -> tuple[int, dict]:
        if path != "/v1/chat/completions":
            return 404, {"error": "not found"}
        content = body["messages"][0]["content"]
        image = _image(next(p["image_url"]["url"] for p in content if p["type"] == "image_url"))
        text = next(p["text"] for p in content if p["type"] == "text")
        caption_match = re.search(r"Caption: (.*)", text)
        caption = caption_match.group(1) if caption_match else "<transcribe>"
        with self.lock:
            self.attempts[caption] += 1
            attempt = self.attempts[caption]
        if "down" in caption or ("flaky" in caption and attempt == 1):
            return 500, {"error": "internal error"}
        if caption_match is None:
            rgb = tuple(int(v) for v in np.asarray(image).reshape(-1, 3)[0])
            answer = self.texts.get(rgb, "NONE")
        elif "garbage" in caption:
            answer = "It is a nice picture."
        elif "outofrange" in caption:
            answer = "Alignment Score: 7\nStyle Score: 3"
        else:
            answer = f"<think>looks fine</think>Alignment Score: {1 + 4 * grey_level(image):.2f}\nStyle Score: 3"
        return 200, {"choices": [{"index": 0, "message": {"role": "assistant", "content": answer}}]}

    def __enter__(self) -> "FakeVlm":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
