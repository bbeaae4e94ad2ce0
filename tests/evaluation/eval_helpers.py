"""Helpers for evaluation tests: a fake OpenAI-compatible judge server, a pure-torch fake model, image helpers."""

from __future__ import annotations

import ast
import base64
import csv
import io
import json
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import torch
from PIL import Image

from deepgen_rl.models.deepgen.conditioning import Conditioning
from deepgen_rl.services.ocr.launch import free_port  # noqa: F401  (re-exported for the tests)
from tests.shared_data import SHARED_DATA

SHARED_UNIGENBENCH = SHARED_DATA / "unigenbench"


class FakeJudge:
    """Chat-completions server answering from ``table`` in the official answer layout (``<description>`` with
    ``<prompt>``, ``<checkpoint>``, an ``<analysis>`` list and a ``<score>`` list).

    Keys: ``(prompt, index, dup)`` (index/dup read from the red/green of a :func:`write_marker_image` image) or
    ``prompt``; the prompt is found as the longest table prompt contained in the instruction text (so any template works).
    Values (``verdicts``: a list, or the raw text inside ``<score>``; the ``<analysis>`` list gets as many items):
    ``("ok", verdicts)`` | ``("text", "raw answer")`` | ``("seq", [answer, …])`` (the i-th request gets the i-th
    answer, the last one repeats; an answer is raw text or a verdict list) | ``("fail_then_ok", n_failures,
    verdicts)`` (HTTP 500 for the first n requests) | ``("status", code)`` (always) | ``("sleep", seconds, verdicts)``.
    """

    def __init__(self):
        self.table: dict = {}
        self.requests: Counter = Counter()  # key -> number of chat requests
        self.payloads: list[dict] = []
        self.payloads_by_key: dict = {}
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
        known = {k if isinstance(k, str) else k[0] for k in self.table}
        prompt = max((p for p in known if p in text), key=len, default=None)
        img = Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))).convert("RGB")
        r, g = (round((v - 8) / 16) for v in img.getpixel((8, 8))[:2])  # see write_marker_image
        key = (prompt, r, g) if (prompt, r, g) in self.table else prompt
        with self.lock:
            self.payloads.append(payload)
            self.payloads_by_key.setdefault(key, []).append(payload)
            self.requests[key] += 1
            n = self.requests[key]
        behaviour = self.table.get(key, ("text", "no entry"))
        kind = behaviour[0]
        if kind == "ok":
            return 200, _completion(official_answer(prompt, behaviour[1]))
        if kind == "text":
            return 200, _completion(behaviour[1])
        if kind == "seq":
            answer = behaviour[1][min(n, len(behaviour[1])) - 1]
            return 200, _completion(answer if isinstance(answer, str) else official_answer(prompt, answer))
        if kind == "fail_then_ok":
            if n <= behaviour[1]:
                return 500, {"error": "overloaded"}
            return 200, _completion(official_answer(prompt, behaviour[2]))
        if kind == "status":
            return behaviour[1], {"error": "nope"}
        if kind == "sleep":
            time.sleep(behaviour[1])
            return 200, _completion(official_answer(prompt, behaviour[2]))
        raise AssertionError(kind)

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def official_answer(prompt, verdicts) -> str:
    """An answer in the official layout; ``verdicts`` is a list or the raw text inside ``<score>``."""
    body = str(verdicts) if isinstance(verdicts, list) else verdicts
    try:
        n = len(ast.literal_eval(body))
    except (ValueError, SyntaxError, TypeError):
        n = 1
    analysis = [f"point {i}: it's visible" for i in range(n)]  # an apostrophe, so repr uses double quotes
    return (f"<description>\n<prompt>{prompt}</prompt>\n<checkpoint>[...]</checkpoint>\n"
            f"<analysis>{analysis!r}</analysis>\n<score>{body}</score>\n</description>")


def _completion(text):
    return {"id": "x", "object": "chat.completion", "model": "UniGenBench-EvalModel",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]}



def write_marker_image(path: Path, index: int, dup: int) -> None:
    """A small uniform PNG whose red/green encode (index, dup) as 16·v + 8 (index, dup <= 14), so FakeJudge reads them
    back after the client's JPEG re-encoding (which moves a channel by a few levels)."""
    assert 0 <= index <= 14 and 0 <= dup <= 14
    img = Image.new("RGB", (16, 16), (16 * index + 8, 16 * dup + 8, 7))
    path.parent.mkdir(parents=True, exist_ok=True)
    img.save(path)


def write_unigenbench_csv(path: Path, rows: list, header: str | None = None) -> Path:
    """rows: (index, prompt, testpoints, descriptions) or (index, prompt, raw_sub_dims_string); ``header`` None
    writes ``index,prompt,sub_dims``, "en"/"zh" the official ``index,prompt_en,sub_dims_en`` style."""
    with path.open("w", encoding="utf-8", newline="") as f:
        w = csv.writer(f)
        w.writerow(["index", "prompt", "sub_dims"] if header is None else
                   ["index", f"prompt_{header}", f"sub_dims_{header}"])
        for row in rows:
            if len(row) == 3:
                w.writerow(row)
            else:
                i, prompt, tps, descs = row
                keys = ("考点", "考点对应描述") if header == "zh" else ("Testpoints", "Testpoint Description")
                w.writerow([i, prompt, json.dumps({"Primary Categories": "Test", keys[0]: tps, keys[1]: descs},
                                                  ensure_ascii=False)])
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
