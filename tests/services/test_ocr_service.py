"""The OCR service started for real (subprocess on a free port): scores, null for no target, 4xx for bad input,
bearer-token auth, and the service still alive afterwards."""
import base64
import io
import os

import httpx
import pytest
from PIL import Image

from deepgen_rl.services.ocr.launch import OcrServiceProcess, render_text_image

TOKEN = "test-token-123"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
LIMITS = {
    "OCR_MAX_IMAGES": "8",
    "OCR_MAX_IMAGE_PIXELS": "1000000",
    "OCR_MAX_IMAGE_BYTES": "300000",
    "OCR_MAX_BODY_BYTES": "3000000",
    "OCR_MAX_PROMPT_CHARS": "1000",
}


@pytest.fixture(scope="module")
def service():
    env = {"REWARD_API_TOKEN": TOKEN, "OCR_THREADS": "2", "OCR_ORT_THREADS": "1", **LIMITS}
    with OcrServiceProcess(env=env) as svc:
        yield svc


def b64(image: Image.Image, fmt: str = "PNG", **save) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **save)
    return base64.b64encode(buffer.getvalue()).decode()


def post(service, body, headers=AUTH, **kw):
    return httpx.post(f"{service.url}/score", json=body, headers=headers, timeout=60, **kw)


def test_scores_rendered_text(service):
    hello = render_text_image("Hello World")
    sale = render_text_image(["BIG SALE", "50% OFF"])
    body = {
        "images": [b64(hello), b64(hello.convert("RGB"), "JPEG", quality=95), b64(hello), b64(sale), b64(hello)],
        "prompts": [
            'a storefront sign reading "Hello World"',
            "a sign with the text “hello world”",  # curly quotes, case differs
            'a sign reading "Quantum Zebra"',  # a different text
            'a banner "BIG SALE" and "50% OFF"',  # two segments on two lines
            "a photo of a dog without any quoted text",
        ],
    }
    response = post(service, body)
    assert response.status_code == 200, response.text
    scores, texts = response.json()["scores"], response.json()["texts"]
    assert scores[0] >= 0.9 and scores[1] >= 0.9 and scores[3] >= 0.9
    assert scores[2] <= 0.3
    assert scores[4] is None and texts[4] == ""  # no target text: no OCR, no score
    assert "hello" in texts[0].lower()


def _png_bytes(image, fmt="PNG"):
    buffer = io.BytesIO()
    image.save(buffer, format=fmt)
    return buffer.getvalue()


def bad_requests():
    """20 kinds of malformed request: (name, kwargs for httpx.post)."""
    ok_image = b64(Image.new("RGB", (64, 32), "white"))
    big_pixels = b64(Image.new("RGB", (1200, 1000), "white"))  # 1.2 MP > 1 MP, small file
    noise = Image.frombytes("RGB", (320, 320), os.urandom(320 * 320 * 3))
    big_bytes = b64(noise)  # ~300 kB of incompressible PNG > 300000 bytes
    truncated = base64.b64encode(_png_bytes(Image.new("RGB", (64, 64), "white"))[:60]).decode()
    gif = base64.b64encode(_png_bytes(Image.new("RGB", (16, 16)), "GIF")).decode()
    js = lambda obj: {"json": obj}  # noqa: E731
    return [
        ("not json", {"content": b"{not json", "headers": {"content-type": "application/json"}}),
        ("invalid utf-8", {"content": b"\xff\xfe\x00", "headers": {"content-type": "application/json"}}),
        ("wrong content type", {"content": b'{"images": [], "prompts": []}', "headers": {"content-type": "text/plain"}}),
        ("json array", js([ok_image])),
        ("json null", {"content": b"null", "headers": {"content-type": "application/json"}}),
        ("missing images", js({"prompts": ["x"]})),
        ("missing prompts", js({"images": [ok_image]})),
        ("unknown key", js({"images": [ok_image], "prompts": ['"x"'], "prompt": "x"})),
        ("images not a list", js({"images": ok_image, "prompts": ['"x"']})),
        ("prompts not a list", js({"images": [ok_image], "prompts": '"x"'})),
        ("image not a string", js({"images": [123], "prompts": ['"x"']})),
        ("prompt not a string", js({"images": [ok_image], "prompts": [None]})),
        ("empty lists", js({"images": [], "prompts": []})),
        ("mismatched lengths", js({"images": [ok_image, ok_image], "prompts": ['"x"']})),
        ("too many images", js({"images": [ok_image] * 9, "prompts": ['"x"'] * 9})),
        ("invalid base64", js({"images": ["@@@not-base64@@@"], "prompts": ['"x"']})),
        ("base64 of non-image", js({"images": [base64.b64encode(b"hello world").decode()], "prompts": ['"x"']})),
        ("truncated png", js({"images": [truncated], "prompts": ['"x"']})),
        ("gif not allowed", js({"images": [gif], "prompts": ['"x"']})),
        ("wrong data url type", js({"images": ["data:text/plain;base64," + ok_image], "prompts": ['"x"']})),
        ("too many pixels", js({"images": [big_pixels], "prompts": ['"x"']})),
        ("too many bytes", js({"images": [big_bytes], "prompts": ['"x"']})),
        ("body too large", {"content": b"[" + b"0," * 1_600_000 + b"0]", "headers": {"content-type": "application/json"}}),
        ("prompt too long", js({"images": [ok_image], "prompts": ['"' + "x" * 1200 + '"']})),
    ]


EXPECTED_STATUS = {
    "not json": 400, "invalid utf-8": 400, "wrong content type": 415, "invalid base64": 400,
    "base64 of non-image": 400, "truncated png": 400, "gif not allowed": 415, "wrong data url type": 415,
    "too many images": 413, "too many pixels": 413, "too many bytes": 413, "body too large": 413,
}  # everything else: 422 (well-formed JSON of the wrong shape)


def test_bad_requests_get_4xx_and_service_survives(service):
    cases = bad_requests()
    assert len(cases) >= 20
    for name, kwargs in cases:
        headers = {**AUTH, **kwargs.pop("headers", {})}
        response = httpx.post(f"{service.url}/score", headers=headers, timeout=30, **kwargs)
        assert response.status_code == EXPECTED_STATUS.get(name, 422), (name, response.status_code, response.text)
        assert isinstance(response.json()["error"], str), name
    assert httpx.get(f"{service.url}/health", timeout=5).json()["status"] == "ok"
    assert service.alive()
    # and it still scores
    ok = post(service, {"images": [b64(render_text_image("OK 42"))], "prompts": ['"OK 42"']})
    assert ok.status_code == 200 and ok.json()["scores"][0] >= 0.9


def test_status_codes_are_specific(service):
    ok_image = b64(Image.new("RGB", (64, 32), "white"))
    assert post(service, {"images": [ok_image] * 9, "prompts": ['"x"'] * 9}).status_code == 413
    assert post(service, {"images": [ok_image], "prompts": [1]}).status_code == 422
    assert post(service, {"images": ["@@"], "prompts": ['"x"']}).status_code == 400
    assert httpx.get(f"{service.url}/score", headers=AUTH).status_code == 405


def test_bearer_token_enforced(service):
    body = {"images": [b64(Image.new("RGB", (64, 32), "white"))], "prompts": ['"x"']}
    assert post(service, body, headers={}).status_code == 401
    assert post(service, body, headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert post(service, body, headers={"Authorization": TOKEN}).status_code == 401  # scheme missing
    assert httpx.get(f"{service.url}/stats").status_code == 401
    assert post(service, body).status_code == 200
    assert httpx.get(f"{service.url}/health").status_code == 200  # health stays open


def test_extreme_aspect_image_fails_alone_and_service_survives(service):
    """RapidOCR raises on 1x4000 / 4000x2 images: those get null + an error, the rest of the request is scored."""
    before = httpx.get(f"{service.url}/stats", headers=AUTH, timeout=5).json()
    hello, sale = render_text_image("Hello World"), render_text_image(["BIG SALE", "50% OFF"])
    body = {
        "images": [b64(hello), b64(Image.new("RGB", (1, 4000), "white")), b64(Image.new("RGB", (4000, 2), "white")),
                   b64(sale), b64(Image.new("RGB", (1, 4000), "white"))],
        "prompts": ['"Hello World"', '"thin"', '"flat"', '"BIG SALE" "50% OFF"', "no quoted text"],
    }
    response = post(service, body)
    assert response.status_code == 200, response.text
    out = response.json()
    assert out["scores"][0] >= 0.9 and out["scores"][3] >= 0.9
    assert out["scores"][1] is None and out["scores"][2] is None and out["scores"][4] is None
    assert out["texts"][1] == out["texts"][2] == ""
    assert "ResizeImgError" in out["errors"][1] and "ResizeImgError" in out["errors"][2]
    assert out["errors"][0] is None and out["errors"][3] is None
    assert out["errors"][4] is None  # no target text: not OCR'd, so no error
    after = httpx.get(f"{service.url}/stats", headers=AUTH, timeout=5).json()
    assert after["images_failed"] - before["images_failed"] == 2
    assert service.alive() and httpx.get(f"{service.url}/health", timeout=5).json()["status"] == "ok"


def test_unexpected_exception_is_a_json_500(monkeypatch):
    """Any exception outside the per-image OCR (here: target extraction) answers 500 with a JSON error body."""
    from fastapi.testclient import TestClient

    from deepgen_rl.services.ocr import app as app_module
    from deepgen_rl.services.ocr import scoring
    from deepgen_rl.services.ocr.config import OcrServiceConfig

    def boom(prompt):
        raise RuntimeError("extraction exploded")

    monkeypatch.setattr(scoring, "extract_target_texts", boom)  # what ocr_local.wants calls
    client = TestClient(app_module.create_app(OcrServiceConfig(threads=1, ort_threads=1)),
                        raise_server_exceptions=False)
    response = client.post("/score", json={"images": [b64(Image.new("RGB", (8, 8)))], "prompts": ['"x"']})
    assert response.status_code == 500
    assert response.headers["content-type"].startswith("application/json")
    assert response.json() == {"error": "internal error: RuntimeError: extraction exploded"}
    assert client.get("/health").status_code == 200
