"""OCR reward client against the real OCR service, and compute_weighted_rewards (skipping, concurrency, errors)."""
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
import torch
from PIL import Image

from deepgen_rl.rewards import Reward, compute_weighted_rewards, get_reward
from deepgen_rl.services.ocr.launch import OcrServiceProcess, render_text_image


@pytest.fixture(scope="module")
def service():
    with OcrServiceProcess(env={"OCR_THREADS": "2", "OCR_ORT_THREADS": "1", "REWARD_API_TOKEN": ""}) as svc:
        yield svc


def stats(service) -> dict:
    return httpx.get(f"{service.url}/stats", timeout=5).json()


def test_ocr_reward_scores_batches_and_nulls(service):
    before = stats(service)
    images = [render_text_image("Hello World"), render_text_image("DeepGen RL"), render_text_image("Hello World"),
              render_text_image("no text wanted"), render_text_image("DeepGen RL")]
    prompts = ['"Hello World"', 'logo "DeepGen RL"', '"Zebra Crossing"', "a plain prompt", "“deepgen rl”"]
    reward = get_reward("ocr", url=service.url, batch_size=2)
    out = reward(images, prompts, [{}] * 5)
    assert out.valid.tolist() == [True, True, True, False, True]
    assert out.scores[0] >= 0.9 and out.scores[1] >= 0.9 and out.scores[4] >= 0.9 and out.scores[2] <= 0.3
    assert out.scores[3] == 0.0
    assert out.info["no_target_text"] == 1 and out.info["request_failed"] == 0
    assert out.info["requests"] == 3  # ceil(5 / 2)
    after = stats(service)
    assert after["requests"] - before["requests"] == 3
    assert after["images_ocr"] - before["images_ocr"] == 4  # the null prompt is not OCR'd


def test_ocr_reward_is_thread_safe(service):
    images = [render_text_image("Hello World"), render_text_image("Quantum")]
    reward = get_reward("ocr", url=service.url, batch_size=1)
    serial = reward(images, ['"Hello World"', '"Quantum"'], [{}, {}]).scores
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: reward(images, ['"Hello World"', '"Quantum"'], [{}, {}]).scores, range(4)))
    assert all(torch.equal(r, serial) for r in results)


def test_ocr_reward_unreachable_service_is_invalid_not_scored():
    reward = get_reward("ocr", url="http://127.0.0.1:9", max_retries=2, backoff_s=0.01, timeout_s=2)
    out = reward([render_text_image("x")] * 3, ['"x"'] * 3, [{}] * 3)
    assert not out.valid.any() and out.info["request_failed"] == 3 and out.info["requests"] == 3
    assert out.info["num_failed"] == 3 and out.info["num_scored"] == 0


class _ScriptedOcr:
    """A local server answering /score from a script of (status, body[, headers]) responses; counts requests."""

    def __init__(self, script):
        self.script, self.requests = list(script), 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                n = len(json.loads(self.rfile.read(int(self.headers["Content-Length"])))["images"])
                owner.requests += 1
                status, body, *extra = owner.script.pop(0) if owner.script else (500, {"error": "script exhausted"})
                data = json.dumps(body(n) if callable(body) else body).encode()
                self.send_response(status)
                for key, value in (extra[0] if extra else {}).items():
                    self.send_header(key, value)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()


def test_ocr_reward_retries_5xx_and_429_then_succeeds():
    ok = lambda n: {"scores": [0.5] * n, "texts": ["t"] * n}  # noqa: E731
    server = _ScriptedOcr([(503, {"error": "x"}), (429, {"error": "busy"}), (200, ok)])
    out = get_reward("ocr", url=server.url, backoff_s=0.01, max_retries=3)([render_text_image("x")] * 2, ['"x"'] * 2,
                                                                           [{}] * 2)
    assert out.valid.all() and out.scores.tolist() == [0.5, 0.5]
    assert server.requests == 3 and out.info["retries"] == 2
    server.server.shutdown()


def test_unusable_retry_after_falls_back_to_backoff(monkeypatch):
    """Retry-After -1 / nan / inf / junk: normal backoff (time.sleep(-1) or sleep(nan) would raise ValueError and
    abort the whole reward call); 0 and 5 are used, capped by max_backoff_s; then the request succeeds."""
    from deepgen_rl.utils import http

    delays = []
    monkeypatch.setattr(http.time, "sleep", delays.append)
    ok = lambda n: {"scores": [0.5] * n, "texts": ["t"] * n}  # noqa: E731
    busy = [(429, {"error": "busy"}, {"Retry-After": value}) for value in ("-1", "nan", "inf", "soon", "0", "5")]
    server = _ScriptedOcr([*busy, (200, ok)])
    reward = get_reward("ocr", url=server.url, backoff_s=0.01, max_backoff_s=0.05, max_retries=6)
    out = reward([render_text_image("x")] * 2, ['"x"'] * 2, [{}] * 2)
    assert out.valid.all() and out.scores.tolist() == [0.5, 0.5] and out.info["retries"] == 6
    assert delays == pytest.approx([0.01, 0.02, 0.04, 0.05, 0.0, 0.05])
    assert server.requests == 7
    server.server.shutdown()


def test_negative_and_nan_retry_after_really_sleep_and_succeed():
    """Unpatched time.sleep: a negative or NaN Retry-After must not raise ValueError out of the retry loop."""
    from deepgen_rl.utils.http import post_json_with_retries

    server = _ScriptedOcr([(429, {}, {"Retry-After": "-1"}), (429, {}, {"Retry-After": "nan"}), (200, {"ok": 1})])
    with httpx.Client() as client:
        body, attempts = post_json_with_retries(client, f"{server.url}/score", {"images": []}, timeout_s=5,
                                                max_retries=2, backoff_s=0.01)
    assert body == {"ok": 1} and attempts == 3 and server.requests == 3
    server.server.shutdown()


def test_ocr_reward_per_image_error_invalidates_only_that_image():
    body = {"scores": [0.5, None, None, 1.0], "texts": ["t", "", "", "u"],
            "errors": [None, "ResizeImgError", None, None]}
    server = _ScriptedOcr([(200, body)])
    out = get_reward("ocr", url=server.url)([render_text_image("x")] * 4, ['"x"', '"y"', "none", '"u"'], [{}] * 4)
    assert out.valid.tolist() == [True, False, False, True] and out.scores.tolist() == [0.5, 0.0, 0.0, 1.0]
    assert out.info["image_failed"] == 1 and out.info["no_target_text"] == 1 and out.info["request_failed"] == 0
    assert out.info["errors"] == ["images[1]: ResizeImgError"] and out.info["texts"] == ["t", "", "", "u"]
    assert out.info["num_failed"] == 2 and out.info["num_scored"] == 2
    server.server.shutdown()


def test_ocr_reward_extreme_aspect_image_against_real_service(service):
    images = [render_text_image("Hello World"), Image.new("RGB", (1, 4000), "white"), render_text_image("DeepGen RL")]
    out = get_reward("ocr", url=service.url)(images, ['"Hello World"', '"thin"', '"DeepGen RL"'], [{}] * 3)
    assert out.valid.tolist() == [True, False, True] and out.scores[0] >= 0.9 and out.scores[2] >= 0.9
    assert out.info["image_failed"] == 1 and out.info["request_failed"] == 0 and out.info["requests"] == 1
    assert len(out.info["errors"]) == 1 and out.info["errors"][0].startswith("images[1]: ResizeImgError")


@pytest.mark.parametrize(
    "script",
    [
        [(422, {"error": "bad"})],  # 4xx: not retried
        [(200, {"scores": [0.5]})],  # wrong length
        [(200, {"scores": [7.0, 0.1]})],  # out of range
        [(500, {})] * 3,  # retries exhausted
        [(200, {"scores": [0.5, 0.5], "texts": ["t"]})],  # fewer texts than scores (zip would drop a score)
        [(200, {"scores": [0.5, 0.5]})],  # texts missing
        [(200, {"scores": [0.5, 0.5], "texts": ["t", 3]})],  # a text that is not a string
        [(200, {"scores": [0.5, 0.5], "texts": ["t", "u"], "errors": [None]})],  # errors of the wrong length
        [(200, {"scores": [0.5, 0.5], "texts": ["t", "u"], "errors": [None, 1]})],  # an error that is not a string
        [(200, {"scores": [0.5, 0.5], "texts": ["t", "u"], "errors": [None, "x"]})],  # a score and an error
    ],
)
def test_ocr_reward_bad_responses_mark_invalid(script):
    server = _ScriptedOcr(script)
    out = get_reward("ocr", url=server.url, backoff_s=0.01, max_retries=2)([render_text_image("x")] * 2, ['"x"'] * 2,
                                                                           [{}] * 2)
    assert not out.valid.any() and out.info["request_failed"] == 2 and out.info["errors"]
    assert server.requests == len(script)
    server.server.shutdown()


class Exploding(Reward):
    def score(self, images, prompts, metadata):
        raise RuntimeError("judge exploded")


def test_compute_weighted_rewards_calls_ocr_only_on_weighted_samples(service):
    images = [render_text_image("Hello World"), Image.new("RGB", (64, 64), "white"), render_text_image("OPEN 24H"),
              Image.new("RGB", (64, 64), "black"), render_text_image("BIG SALE"), Image.new("RGB", (64, 64), "red")]
    prompts = ['"Hello World"', "a white square", 'sign "OPEN 24H"', "a black square", '"big sale"', "a red square"]
    metadata = [{"group_id": i // 2} for i in range(6)]
    names = ["ocr", "brightness", "color_target", "boom"]
    weights = torch.tensor([
        [1.0, 0.0, 0.0, 0.0],
        [0.0, 0.5, 0.0, 0.5],
        [1.0, 0.0, 0.0, 0.0],
        [0.0, 0.5, 0.0, 0.5],
        [0.7, 0.3, 0.0, 0.0],
        [0.0, 0.0, 1.0, 0.0],
    ])
    rewards = {"ocr": get_reward("ocr", url=service.url), "brightness": get_reward("brightness"),
               "color_target": get_reward("color_target"), "boom": Exploding()}
    before = stats(service)
    out = compute_weighted_rewards(rewards, images, prompts, metadata, weights, names)
    after = stats(service)
    assert after["images_received"] - before["images_received"] == 3  # only the OCR-weighted images were sent
    assert out.scores.shape == (6, 4) and out.scores.dtype == torch.float32 and out.valid.dtype == torch.bool
    assert out.valid[:, 0].tolist() == [True, False, True, False, True, False]
    assert (out.scores[[0, 2, 4], 0] >= 0.9).all()
    assert out.valid[:, 1].tolist() == [False, True, False, True, True, False]
    assert out.scores[1, 1] == pytest.approx(1.0) and out.scores[3, 1] == pytest.approx(0.0)
    assert out.valid[:, 2].tolist() == [False] * 5 + [True] and out.scores[5, 2] == pytest.approx(1.0)
    # a raising reward: no score, error recorded
    assert not out.valid[:, 3].any() and (out.scores[:, 3] == 0).all()
    boom = out.info["per_reward"]["boom"]
    assert "judge exploded" in boom["error"] and boom["num_failed"] == 2 and boom["num_scored"] == 0
    for name in names:
        info = out.info["per_reward"][name]
        assert {"latency_s", "num_scored", "num_failed", "num_skipped"} <= info.keys()
        assert info["num_skipped"] == int((weights[:, names.index(name)] == 0).sum())
    assert (out.scores[~out.valid] == 0).all()


def test_compute_weighted_rewards_never_calls_an_unweighted_reward():
    images = [Image.new("RGB", (8, 8), "white")] * 2
    out = compute_weighted_rewards({"boom": Exploding(), "brightness": get_reward("brightness")}, images, ["a", "b"],
                                   [{}, {}], torch.tensor([[0.0, 1.0], [0.0, 1.0]]), ["boom", "brightness"])
    assert "error" not in out.info["per_reward"]["boom"] and out.info["per_reward"]["boom"]["num_skipped"] == 2
    assert out.valid[:, 1].all() and not out.valid[:, 0].any()
    with pytest.raises(ValueError, match="shape"):
        compute_weighted_rewards({}, images, ["a", "b"], [{}, {}], torch.ones(2, 3), ["a", "b"])
    with pytest.raises(KeyError, match="missing"):
        compute_weighted_rewards({}, images, ["a", "b"], [{}, {}], torch.ones(2, 1), ["missing"])


def test_compute_weighted_rewards_runs_rewards_concurrently():
    barrier = threading.Barrier(2, timeout=5)

    class Waits(Reward):
        def score(self, images, prompts, metadata):
            barrier.wait()  # deadlocks (BrokenBarrierError after 5 s) unless both rewards run at the same time
            return torch.ones(len(images)), torch.ones(len(images), dtype=torch.bool), {}

    images = [Image.new("RGB", (8, 8))] * 2
    out = compute_weighted_rewards({"a": Waits(), "b": Waits()}, images, ["x", "y"], [{}, {}], torch.ones(2, 2),
                                   ["a", "b"])
    assert out.valid.all()


def test_ocr_reward_short_texts_error_message_is_clear():
    server = _ScriptedOcr([(200, {"scores": [0.5, 0.5], "texts": ["t"]})])
    out = get_reward("ocr", url=server.url)([render_text_image("x")] * 2, ['"x"'] * 2, [{}] * 2)
    assert not out.valid.any()
    assert "'texts' must be a list of 2 strings or nulls, got a list of 1 (str)" in out.info["errors"][0]
    server.server.shutdown()
