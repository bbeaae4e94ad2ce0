"""Helpers for evaluation tests: a fake OpenAI-compatible judge server, a pure-torch fake model, image helpers."""

from __future__ import annotations

import base64
import csv
import io
import json
import re
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import torch
from PIL import Image

from deepgen_rl.models.deepgen.conditioning import Conditioning
from deepgen_rl.services.ocr.launch import free_port  # noqa: F401  (re-exported for the tests)

SHARED_UNIGENBENCH = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "unigenbench"

_PROMPT_RE = [re.compile(r"Prompt: (.*?)\n\nTest points:", re.DOTALL), re.compile(r"提示词：(.*?)\n\n考点：", re.DOTALL)]


class FakeJudge:
    """Chat-completions server answering from ``table``.

    Keys: ``(prompt, index, dup)`` (index/dup read from the image's pixel (0, 0) red/green) or ``prompt``.
    Values: ``("ok", [verdicts])`` | ``("text", "raw answer")`` | ``("fail_then_ok", n_failures, [verdicts])``
    (HTTP 500 for the first n requests) | ``("status", code)`` (always) | ``("sleep", seconds, [verdicts])``.
    """

    def __init__(self):
        self.table: dict = {}
        self.requests: Counter = Counter()  # key -> number of chat requests
        self.payloads: list[dict] = []
        self.lock = threading.Lock()
        judge = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, code, obj):
                body = json.dumps(obj).encode()
                try:
                    self.send_response(code)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def do_GET(self):
                self._send(200, {"object": "list", "data": [{"id": "UniGenBench-EvalModel"}]})

            def do_POST(self):
                payload = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                self._send(*judge.answer(payload))

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                       daemon=True)
        self.thread.start()

    def answer(self, payload):
        content = payload["messages"][0]["content"]
        text = next(c["text"] for c in content if c["type"] == "text")
        url = next(c["image_url"]["url"] for c in content if c["type"] == "image_url")
        prompt = next(m.group(1) for r in _PROMPT_RE if (m := r.search(text)))
        img = Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))).convert("RGB")
        r, g, _ = img.getpixel((0, 0))
        key = (prompt, r, g) if (prompt, r, g) in self.table else prompt
        with self.lock:
            self.payloads.append(payload)
            self.requests[key] += 1
            n = self.requests[key]
        behaviour = self.table.get(key, ("text", "no entry"))
        kind = behaviour[0]
        if kind == "ok":
            return 200, _completion(f"<think>checking</think>\nAll done. <score>{behaviour[1]}</score>")
        if kind == "text":
            return 200, _completion(behaviour[1])
        if kind == "fail_then_ok":
            if n <= behaviour[1]:
                return 500, {"error": "overloaded"}
            return 200, _completion(f"<score>{behaviour[2]}</score>")
        if kind == "status":
            return behaviour[1], {"error": "nope"}
        if kind == "sleep":
            time.sleep(behaviour[1])
            return 200, _completion(f"<score>{behaviour[2]}</score>")
        raise AssertionError(kind)

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def _completion(text):
    return {"id": "x", "object": "chat.completion", "model": "UniGenBench-EvalModel",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]}



def write_marker_image(path: Path, index: int, dup: int) -> None:
    """A small PNG whose pixel (0, 0) encodes (index, dup) in red/green (read back by FakeJudge)."""
    img = Image.new("RGB", (16, 16), (index, dup, 7))
    path.parent.mkdir(parents=True, exist_ok=True)
    img.save(path)


def write_unigenbench_csv(path: Path, rows: list) -> Path:
    """rows: (index, prompt, testpoints, descriptions) or (index, prompt, raw_sub_dims_string)."""
    with path.open("w", encoding="utf-8", newline="") as f:
        w = csv.writer(f)
        w.writerow(["index", "prompt", "sub_dims"])
        for row in rows:
            if len(row) == 3:
                w.writerow(row)
            else:
                i, prompt, tps, descs = row
                w.writerow([i, prompt, json.dumps({"Primary Categories": "Test", "Testpoints": tps,
                                                   "Testpoint Description": descs})])
    return path


class FakeModel:
    """Pure-torch stand-in for DeepGen's eval API. v = x·a + c, with c from the prompt (pooled_embeds[:, 0])."""

    scheduler_shift = 3.0

    def __init__(self, a: float = 0.3):
        self.a = a
        self.forward_batches: list[int] = []
        self.transformers_seen: list = []

    def encode_prompts(self, prompts):
        vals = torch.tensor([(sum(map(ord, p)) % 89) / 89.0 - 0.5 for p in prompts], dtype=torch.float32)
        pooled = vals[:, None].repeat(1, 4)
        return Conditioning(prompt_embeds=pooled[:, None, :].repeat(1, 2, 1), pooled_embeds=pooled)

    def predict_velocity(self, latents, sigma, cond, transformer=None):
        assert sigma.shape == (latents.shape[0],)
        assert len(cond) == latents.shape[0]
        self.forward_batches.append(latents.shape[0])
        self.transformers_seen.append(transformer)
        a = self.a if transformer is None else transformer["a"]
        return latents * a + cond.pooled_embeds[:, 0].view(-1, 1, 1, 1)

    def latent_shape(self, height, width):
        return (16, height // 8, width // 8)

    def decode_latents(self, latents):
        x = torch.sigmoid(latents[:, :3])
        return x.repeat_interleave(8, dim=2).repeat_interleave(8, dim=3)
