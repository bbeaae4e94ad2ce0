"""A real HTTP server speaking OpenAI chat-completions that judges two images deterministically (used by tests).

Verdict: the brighter image wins. The caption selects failure modes: "garbage" (unparseable answer), "partial"
(unparseable when an image is nearly black), "flaky" (HTTP 500 on the first attempt of each request), "down"
(always 500), "slow" (first attempt sleeps past the client's timeout), "biased" (always "Image 1"), "reject" (400).
Every attempt is counted per (caption, brightness of image 1, brightness of image 2).
"""
from __future__ import annotations

import base64
import io
import json
import re
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
from PIL import Image


def _brightness(data_url: str) -> float:
    raw = base64.b64decode(data_url.split(",", 1)[1])
    return round(float(np.asarray(Image.open(io.BytesIO(raw)).convert("L"), dtype=np.float64).mean() / 255.0), 3)


class FakeJudge:
    def __init__(self, slow_sleep_s: float = 1.5):
        self.slow_sleep_s = slow_sleep_s
        self.attempts: Counter = Counter()  # key -> HTTP requests received
        self.answered: Counter = Counter()  # key -> 200 responses sent
        self.bodies: list[dict] = []
        self.lock = threading.Lock()
        self.in_flight = 0
        self.max_in_flight = 0
        judge = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output clean
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with judge.lock:
                    judge.in_flight += 1
                    judge.max_in_flight = max(judge.max_in_flight, judge.in_flight)
                try:
                    status, payload = judge.respond(self.path, body)
                finally:
                    with judge.lock:
                        judge.in_flight -= 1
                data = json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client timed out and left
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                       daemon=True)

    def respond(self, path: str, body: dict) -> tuple[int, dict]:
        content = body["messages"][0]["content"]
        urls = [part["image_url"]["url"] for part in content if part["type"] == "image_url"]
        text = next(part["text"] for part in content if part["type"] == "text")
        caption = re.search(r"Caption: (.*)", text).group(1)
        b1, b2 = _brightness(urls[0]), _brightness(urls[1])
        key = (caption, b1, b2)
        with self.lock:
            self.bodies.append(body)
            self.attempts[key] += 1
            attempt = self.attempts[key]
        if path != "/v1/chat/completions":
            return 404, {"error": "not found"}
        if "down" in caption or ("flaky" in caption and attempt == 1):
            return 500, {"error": "internal error"}
        if "reject" in caption:
            return 400, {"error": "bad request"}
        if "slow" in caption and attempt == 1:
            time.sleep(self.slow_sleep_s)
        if "garbage" in caption or ("partial" in caption and min(b1, b2) < 0.1):
            answer = "<think>hard to say</think> I like both of them."
        elif "biased" in caption:
            answer = "<think>the first one</think><answer>Image 1 is better</answer>"
        else:
            answer = f"<think>compare brightness</think><answer>Image {1 if b1 > b2 else 2} is better</answer>"
        with self.lock:
            self.answered[key] += 1
        return 200, {"id": "x", "object": "chat.completion", "model": body["model"],
                     "choices": [{"index": 0, "message": {"role": "assistant", "content": answer},
                                  "finish_reason": "stop"}]}

    def __enter__(self) -> "FakeJudge":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
