"""The reward server started for real: remote == in-process scores, micro-batching, replicas, and hardening
(bounded JSON nesting on a kept-alive connection, Connection: close exactly on 500 and 408, header/body timeouts,
SIGTERM with partial requests, pixel budget before decoding, decoding only what the reward wants, one-line
disconnect logs, docs behind the token). Connection behaviour is checked with an h11 client on one raw socket."""
import base64
import io
import json
import math
import signal
import socket
import time

import httpx
import pytest
import torch
from PIL import Image

from raw_http import H11Client, uvicorn_thread

from deepgen_rl.rewards import get_reward
from deepgen_rl.rewards.testing import build_tiny_clip
from deepgen_rl.services.ocr.launch import OcrServiceProcess
from deepgen_rl.services.reward.app import RewardScorer, create_app
from deepgen_rl.services.reward.config import ServiceConfig
from deepgen_rl.services.reward.launch import RewardServerProcess

TOKEN = "tok-456"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
HARDENED = {"REWARD_API_TOKEN": TOKEN, "REWARD_HEADER_TIMEOUT_S": "1", "REWARD_BODY_TIMEOUT_S": "1",
            "REWARD_MAX_IMAGES": "8", "REWARD_MAX_IMAGE_PIXELS": "1000000", "REWARD_MAX_REQUEST_PIXELS": "1500000",
            "REWARD_MAX_BODY_BYTES": "2000000", "REWARD_MAX_PROMPT_CHARS": "1000", "REWARD_GRACEFUL_SHUTDOWN_S": "2"}


def b64(image, fmt="PNG"):
    buffer = io.BytesIO()
    image.save(buffer, format=fmt)
    return base64.b64encode(buffer.getvalue()).decode()


def imgs(n):
    return [Image.new("RGB", (30 + 2 * i, 36), ((40 * i) % 256, 180, 60 + 10 * i)) for i in range(n)]


PROMPTS = ["a photo of a cat", "a red car", "green sign", "the blue dog", "a photo", "a bench"]


@pytest.fixture(scope="module")
def clip_dir(tmp_path_factory):
    return build_tiny_clip(tmp_path_factory.mktemp("clip"), logit_scale=math.log(5.0))


@pytest.fixture(scope="module")
def hardened(tmp_path_factory):
    log = tmp_path_factory.mktemp("logs") / "server.log"
    with RewardServerProcess(["brightness"], env=HARDENED, log_path=str(log)) as server:
        server.log = log
        yield server


def test_remote_equals_in_process_and_micro_batches(clip_dir):
    kwargs = {"pickscore": {"model_name_or_path": clip_dir}}
    local = get_reward("pickscore", model_name_or_path=clip_dir)(imgs(6), PROMPTS)
    env = {"REWARD_BATCH_WAIT_MS": "300", "REWARD_API_TOKEN": ""}
    # two replicas (data parallel over "devices"), each coalescing queued requests
    with RewardServerProcess(["pickscore", "brightness"], kwargs, env=env,
                             args=["--micro_batch", "on", "--devices", "cpu,cpu"]) as server:
        remote = get_reward("pickscore", remote_url=server.url, batch_size=4)
        assert remote.name == "pickscore"
        out = remote(imgs(6), PROMPTS)
        assert out.valid.all() and torch.allclose(out.scores, local.scores, atol=1e-5)
        bright = get_reward("remote", url=server.url, name="brightness")(imgs(3), PROMPTS[:3])
        assert torch.allclose(bright.scores, get_reward("brightness")(imgs(3), PROMPTS[:3]).scores, atol=1e-6)
        # 6 one-image requests at once are coalesced into fewer reward calls with the same scores
        single = get_reward("pickscore", remote_url=server.url, batch_size=1, max_concurrent_requests=6)
        before = httpx.get(f"{server.url}/stats").json()
        again = single(imgs(6), PROMPTS)
        after = httpx.get(f"{server.url}/stats").json()
        assert torch.allclose(again.scores, local.scores, atol=1e-5)
        assert after["reward_calls"] - before["reward_calls"] < 6 and after["largest_batch"] > 1
        assert httpx.post(f"{server.url}/score", json={"images": [], "prompts": []}).status_code == 404
        missing = httpx.post(f"{server.url}/score/nope", json={"images": [b64(imgs(1)[0])], "prompts": ["x"]})
        assert missing.status_code == 404 and "pickscore" in missing.json()["error"]
        assert httpx.get(f"{server.url}/health").json()["rewards"] == ["brightness", "pickscore"]


def test_failed_requests_never_become_scores():
    out = get_reward("pickscore", remote_url="http://127.0.0.1:9", max_retries=1, backoff_s=0.01)(imgs(2), PROMPTS[:2])
    assert not out.valid.any() and out.info["request_failed"] == 2
    # a reward that is already a client keeps its own protocol: remote_url is just its url
    ocr = get_reward("ocr", remote_url="http://127.0.0.1:9/")
    assert type(ocr).__name__ == "OcrReward" and ocr.endpoint == "http://127.0.0.1:9/score"


def _raw(server, data: bytes) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    sock.sendall(data)
    return sock


def _closed_within(sock, seconds) -> tuple[bool, bytes]:
    sock.settimeout(seconds)
    received = b""
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return True, received
            received += chunk
    except socket.timeout:
        return False, received


JSON_AUTH = (("Content-Type", "application/json"), ("Authorization", f"Bearer {TOKEN}"))


def test_deep_nesting_is_400_on_one_kept_alive_connection(hardened):
    """Every request on ONE socket (h11): a 400 without Connection: close, and the next request is answered."""
    client = H11Client(hardened.port)
    # depth 1e6 of arrays fits REWARD_MAX_BODY_BYTES=2e6; objects take 6 bytes a level
    cases = [("[", "]", 1_000), ("[", "]", 100_000), ("[", "]", 999_000),
             ('{"a":', "}", 1_000), ('{"a":', "}", 100_000), ('{"a":', "}", 300_000)]
    for opener, closer, depth in cases:
        status, headers, body = client.request("POST", "/score/brightness",
                                               (opener * depth + "1" + closer * depth).encode(), JSON_AUTH)
        assert status == 400 and "REWARD_MAX_JSON_DEPTH" in json.loads(body)["error"]
        assert headers.get("connection") != "close"
    nested_meta = {"images": [b64(imgs(1)[0])], "prompts": ["x"], "metadata": [{"a": [[[[[[[[[[[[]]]]]]]]]]]]}]}
    assert client.request("POST", "/score", json.dumps(nested_meta).encode(), JSON_AUTH)[0] == 200
    deep_meta = {"images": [b64(imgs(1)[0])], "prompts": ["x"], "metadata": [json.loads("[" * 40 + "]" * 40)]}
    assert client.request("POST", "/score", json.dumps(deep_meta).encode(), JSON_AUTH)[0] == 400
    status, _, body = client.request("POST", "/score", json.dumps({"images": [b64(imgs(1)[0])],
                                                                   "prompts": ["x"]}).encode(), JSON_AUTH)
    assert status == 200 and json.loads(body)["scores"][0] is not None
    assert not client.server_closed(timeout=0.5)  # still open: 9 requests, 1 connection
    client.close()


class _BrokenWants:
    """A reward whose ``wants`` raises: a bug outside the scoring threads, so the server answers 500."""

    name = "broken"

    def wants(self, prompt, meta):
        raise RuntimeError("bug in wants")


def test_a_500_sends_connection_close_and_the_server_closes():
    app = create_app(ServiceConfig(), {"broken": [RewardScorer(_BrokenWants())],
                                       "brightness": [RewardScorer(get_reward("brightness"))]})
    body = json.dumps({"images": [b64(imgs(1)[0])], "prompts": ["x"]}).encode()
    json_only = (("Content-Type", "application/json"),)
    with uvicorn_thread(app) as port:
        client = H11Client(port)
        assert client.request("POST", "/score/brightness", body, json_only)[0] == 200  # keep-alive before
        status, headers, answer = client.request("POST", "/score/broken", body, json_only)
        assert status == 500 and headers["connection"] == "close"
        assert json.loads(answer)["error"] == "internal error: RuntimeError: bug in wants"
        assert client.server_closed(timeout=5)
        client.close()


def test_partial_headers_and_bodies_time_out(hardened):
    start = time.monotonic()
    partial_header = _raw(hardened, b"POST /score HTTP/1.1\r\nHost: x\r\nContent-Type: applic")
    closed, _ = _closed_within(partial_header, 5)
    assert closed and time.monotonic() - start < 4
    idle = _raw(hardened, b"")
    assert _closed_within(idle, 5)[0]
    partial_body = _raw(hardened, b"POST /score HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                  b"Authorization: Bearer " + TOKEN.encode() +
                                  b"\r\nContent-Length: 1000\r\n\r\n{\"ima")
    closed, answer = _closed_within(partial_body, 6)
    assert answer.startswith(b"HTTP/1.1 408") and closed
    assert b"\r\nconnection: close\r\n" in answer.lower()
    assert httpx.get(f"{hardened.url}/health").status_code == 200


def test_client_disconnect_is_one_log_line(hardened):
    sock = _raw(hardened, b"POST /score HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nAuthorization: "
                          b"Bearer " + TOKEN.encode() + b"\r\nContent-Length: 5000\r\n\r\n{\"images\": [")
    time.sleep(0.3)
    sock.close()
    time.sleep(0.5)
    log = hardened.log.read_text()
    assert "disconnected after sending" in log and "Traceback" not in log


def test_pixel_budget_is_checked_before_decoding(hardened):
    big = b64(Image.new("RGB", (900, 900), "white"))  # 0.81 MP each: one fits, two exceed 1.5 MP
    ok = httpx.post(f"{hardened.url}/score", json={"images": [big], "prompts": ["x"]}, headers=AUTH)
    assert ok.status_code == 200
    rejected = httpx.post(f"{hardened.url}/score", json={"images": [big, big], "prompts": ["x", "y"]}, headers=AUTH)
    assert rejected.status_code == 413 and "REWARD_MAX_REQUEST_PIXELS" in rejected.json()["error"]


def test_docs_are_off_with_a_token_and_on_without(hardened):
    for path in ("/docs", "/openapi.json", "/redoc"):
        assert httpx.get(f"{hardened.url}{path}").status_code == 404
        assert httpx.get(f"{hardened.url}{path}", headers=AUTH).status_code == 404
    from fastapi.testclient import TestClient

    from deepgen_rl.services.reward.app import RewardScorer, create_app
    from deepgen_rl.services.reward.config import ServiceConfig

    with TestClient(create_app(ServiceConfig(), {"brightness": [RewardScorer(get_reward("brightness"))]})) as client:
        assert client.get("/openapi.json").status_code == 200 and client.get("/docs").status_code == 200


def test_ocr_service_decodes_only_images_it_scores():
    """16 white 4096² PNGs whose prompts hold no quoted text: answered without decoding them (RSS stays flat);
    the same images with quoted text exceed OCR_MAX_REQUEST_PIXELS before any decoding."""
    huge = b64(Image.new("RGB", (4096, 4096), "white"))
    with OcrServiceProcess(env={"OCR_THREADS": "1", "OCR_ORT_THREADS": "1", "REWARD_API_TOKEN": ""}) as svc:
        def rss():
            with open(f"/proc/{svc.process.pid}/status") as status:
                return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:"))

        before = rss()
        response = httpx.post(f"{svc.url}/score", json={"images": [huge] * 16, "prompts": ["no text"] * 16},
                              timeout=60)
        assert response.status_code == 200 and response.json()["scores"] == [None] * 16
        scored = httpx.post(f"{svc.url}/score", json={"images": [huge] * 16, "prompts": ['"x"'] * 16}, timeout=60)
        assert scored.status_code == 413 and "OCR_MAX_REQUEST_PIXELS" in scored.json()["error"]
        assert rss() - before < 150 * 2**20  # decoding them would take 16 x 48 MiB


def test_sigterm_is_not_blocked_by_partial_requests(tmp_path):
    server = RewardServerProcess(["brightness"], env=HARDENED, log_path=str(tmp_path / "s.log")).start()
    try:
        held = [_raw(server, b"POST /score HTTP/1.1\r\nHost: x\r\n") for _ in range(20)]
        held += [_raw(server, b"POST /score HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nAuthorization: "
                              b"Bearer " + TOKEN.encode() + b"\r\nContent-Length: 100\r\n\r\n{") for _ in range(20)]
        time.sleep(0.3)
        start = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        server.process.wait(timeout=15)
        assert time.monotonic() - start < 8
        assert server.process.returncode in (0, -signal.SIGTERM)
    finally:
        for sock in held:
            sock.close()
        server.stop()


class _FixedDogs:
    def detect(self, image, classes):
        from deepgen_rl.rewards.geneval import Detection

        return [Detection("dog", 0.95, (0, 0, 10, 10))]


def test_server_decodes_only_the_images_the_reward_wants(monkeypatch):
    """geneval without metadata or template and ocr_vlm without quoted text: null without error, never decoded
    (a corrupt image there is not even noticed), and ocr_vlm sends no request to its (absent) VLM."""
    from fastapi.testclient import TestClient

    from deepgen_rl.services.reward import validation

    decoded = []
    real_decode = validation._decode_pixels
    monkeypatch.setattr(validation, "_decode_pixels", lambda enc, i: decoded.append(i) or real_decode(enc, i))
    good = b64(imgs(1)[0])
    corrupt = base64.b64encode(base64.b64decode(good)[:60]).decode()  # header readable, pixels truncated
    scorers = {"geneval": [RewardScorer(get_reward("geneval", detector=_FixedDogs()))],
               "ocr_vlm": [RewardScorer(get_reward("ocr_vlm", url="http://127.0.0.1:9", max_retries=0))]}
    with TestClient(create_app(ServiceConfig(), scorers)) as client:
        answer = client.post("/score/geneval", json={
            "images": [good, corrupt, corrupt], "prompts": ["x", "a cat on a sofa", "a photo of a dog"],
            "metadata": [{"include": [{"class": "dog", "count": 1}]}, {}, {"tag": "other"}]})
        assert answer.status_code == 400 and decoded == [0, 2]  # the template prompt is wanted: decoded, corrupt
        decoded.clear()
        answer = client.post("/score/geneval", json={
            "images": [good, corrupt], "prompts": ["x", "a cat on a sofa"],
            "metadata": [{"include": [{"class": "dog", "count": 1}]}, {}]})
        assert answer.status_code == 200 and decoded == [0]
        assert answer.json()["scores"] == [1.0, None] and answer.json()["errors"] == [None, None]
        decoded.clear()
        answer = client.post("/score/ocr_vlm", json={"images": [corrupt, corrupt], "prompts": ["no text", "plain"]})
        assert answer.status_code == 200 and answer.json()["scores"] == [None, None] and decoded == []
        stats = client.get("/stats").json()
        assert stats["images_received"] == 7 and stats["images_scored"] == 1 and stats["reward_calls"] == 1
