"""1,000 malformed requests of 39 kinds against the hardened reward server: every answer is a 4xx with a JSON
error, /health answers after every 100, no 5xx ever, and the server's RSS grows by less than 100 MiB."""
import base64
import io
import os

import httpx
import pytest
from PIL import Image

from deepgen_rl.services.reward.launch import RewardServerProcess

TOKEN = "fuzz-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
ENV = {"REWARD_API_TOKEN": TOKEN, "REWARD_HEADER_TIMEOUT_S": "2", "REWARD_BODY_TIMEOUT_S": "2",
       "REWARD_MAX_IMAGES": "8", "REWARD_MAX_IMAGE_PIXELS": "1000000", "REWARD_MAX_REQUEST_PIXELS": "1500000",
       "REWARD_MAX_IMAGE_BYTES": "300000", "REWARD_MAX_BODY_BYTES": "1000000", "REWARD_MAX_PROMPT_CHARS": "1000",
       "REWARD_MAX_METADATA_CHARS": "2000"}
JSON = {"content-type": "application/json"}


def b64(image, fmt="PNG"):
    buffer = io.BytesIO()
    image.save(buffer, format=fmt)
    return base64.b64encode(buffer.getvalue()).decode()


def kinds():
    """(name, method, path, kwargs) for each kind of malformed request."""
    ok = b64(Image.new("RGB", (16, 16), "white"))
    big_pixels = b64(Image.new("RGB", (1100, 1000), "white"))
    budget = b64(Image.new("RGB", (1000, 900), "white"))  # 0.9 MP: two exceed the 1.5 MP request budget
    noise = b64(Image.frombytes("RGB", (330, 330), os.urandom(330 * 330 * 3)))
    raw_png = base64.b64decode(ok)
    truncated = base64.b64encode(raw_png[:60]).decode()
    gif = b64(Image.new("RGB", (8, 8)), "GIF")

    def js(obj):
        return {"json": obj, "headers": AUTH}

    def raw(data, headers=JSON):
        return {"content": data, "headers": {**AUTH, **headers}}

    return [
        ("not json", "POST", "/score", raw(b"{not json")),
        ("truncated json", "POST", "/score", raw(b'{"images": ["')),
        ("invalid utf-8", "POST", "/score", raw(b"\xff\xfe\x00")),
        ("wrong content type", "POST", "/score", raw(b"{}", {"content-type": "text/plain"})),
        ("no content type", "POST", "/score", {"content": b"{}", "headers": AUTH}),
        ("json array", "POST", "/score", js([ok])),
        ("json null", "POST", "/score", raw(b"null")),
        ("json number", "POST", "/score", raw(b"1e999")),
        ("missing images", "POST", "/score", js({"prompts": ["x"]})),
        ("missing prompts", "POST", "/score", js({"images": [ok]})),
        ("unknown key", "POST", "/score", js({"images": [ok], "prompts": ["x"], "extra": 1})),
        ("images not a list", "POST", "/score", js({"images": ok, "prompts": ["x"]})),
        ("prompts not a list", "POST", "/score", js({"images": [ok], "prompts": "x"})),
        ("metadata not a list", "POST", "/score", js({"images": [ok], "prompts": ["x"], "metadata": {}})),
        ("metadata item not an object", "POST", "/score", js({"images": [ok], "prompts": ["x"], "metadata": [1]})),
        ("metadata too long", "POST", "/score",
         js({"images": [ok], "prompts": ["x"], "metadata": [{"a": "b" * 3000}]})),
        ("image not a string", "POST", "/score", js({"images": [7], "prompts": ["x"]})),
        ("prompt not a string", "POST", "/score", js({"images": [ok], "prompts": [None]})),
        ("NaN prompt", "POST", "/score", raw(b'{"images": ["' + ok.encode() + b'"], "prompts": [NaN]}')),
        ("empty lists", "POST", "/score", js({"images": [], "prompts": []})),
        ("mismatched lengths", "POST", "/score", js({"images": [ok, ok], "prompts": ["x"]})),
        ("too many images", "POST", "/score", js({"images": [ok] * 9, "prompts": ["x"] * 9})),
        ("invalid base64", "POST", "/score", js({"images": ["@@not base64@@"], "prompts": ["x"]})),
        ("base64 of text", "POST", "/score", js({"images": [base64.b64encode(b"hello").decode()], "prompts": ["x"]})),
        ("truncated png", "POST", "/score", js({"images": [truncated], "prompts": ["x"]})),
        ("gif", "POST", "/score", js({"images": [gif], "prompts": ["x"]})),
        ("data url of text", "POST", "/score", js({"images": ["data:text/plain;base64," + ok], "prompts": ["x"]})),
        ("too many pixels", "POST", "/score", js({"images": [big_pixels], "prompts": ["x"]})),
        ("request pixel budget", "POST", "/score", js({"images": [budget, budget], "prompts": ["x", "y"]})),
        ("too many bytes", "POST", "/score", js({"images": [noise], "prompts": ["x"]})),
        ("body too large", "POST", "/score", raw(b"[" + b"0," * 520_000 + b"0]")),
        ("prompt too long", "POST", "/score", js({"images": [ok], "prompts": ["x" * 1200]})),
        ("deep arrays", "POST", "/score", raw(b"[" * 100_000 + b"]" * 100_000)),
        ("deep objects", "POST", "/score", raw(b'{"a":' * 50_000 + b"1" + b"}" * 50_000)),
        ("no token", "POST", "/score", {"json": {"images": [ok], "prompts": ["x"]}}),
        ("wrong token", "POST", "/score", {"json": {"images": [ok], "prompts": ["x"]},
                                           "headers": {"Authorization": "Bearer nope"}}),
        ("unknown reward", "POST", "/score/nope", js({"images": [ok], "prompts": ["x"]})),
        ("wrong method", "GET", "/score", {"headers": AUTH}),
        ("stats without token", "GET", "/stats", {}),
    ]


@pytest.fixture(scope="module")
def server():
    with RewardServerProcess(["brightness"], env=ENV) as srv:
        yield srv


def test_thousand_malformed_requests(server):
    cases = kinds()
    assert len(cases) == 39  # the count in the module docstring
    statuses = {}
    with httpx.Client(timeout=30) as client:
        # warm up (allocator arenas, first decodes) before the RSS baseline
        for name, method, path, kwargs in cases:
            client.request(method, f"{server.url}{path}", **kwargs)
        baseline = server.rss_bytes()
        for i in range(1000):
            name, method, path, kwargs = cases[i % len(cases)]
            response = client.request(method, f"{server.url}{path}", **kwargs)
            statuses.setdefault(name, set()).add(response.status_code)
            assert 400 <= response.status_code < 500, (name, response.status_code, response.text[:300])
            assert isinstance(response.json().get("error", response.json().get("detail")), str), name
            if (i + 1) % 100 == 0:
                assert client.get(f"{server.url}/health", timeout=5).json()["status"] == "ok", i
        growth = server.rss_bytes() - baseline
    assert growth < 100 * 2**20, growth
    assert server.alive()
    expected = {"not json": 400, "deep arrays": 400, "deep objects": 400, "truncated png": 400, "gif": 415,
                "too many pixels": 413, "request pixel budget": 413, "body too large": 413, "too many bytes": 413,
                "no token": 401, "unknown reward": 404, "wrong method": 405, "missing images": 422}
    for name, status in expected.items():
        assert statuses[name] == {status}, (name, statuses[name])
    ok = httpx.post(f"{server.url}/score", json={"images": [b64(Image.new("RGB", (8, 8), "white"))], "prompts": ["x"]},
                    headers=AUTH)
    assert ok.status_code == 200 and ok.json()["scores"] == [1.0]
