"""Parse and validate a ``POST /score`` body; every problem is an :class:`ApiError` with a 4xx status.

Status codes: 400 malformed (not JSON, bad base64, undecodable or truncated image), 413 too large (body, image count,
image bytes, image pixels), 415 unsupported media (image not PNG/JPEG), 422 well-formed JSON with the wrong shape
(missing/extra keys, wrong types, empty or mismatched lists, prompt too long).
"""
from __future__ import annotations

import base64
import binascii
import io
import json
import re
from dataclasses import dataclass

from PIL import Image

from .config import OcrServiceConfig

_DATA_URL = re.compile(r"^data:([\w/+.-]+);base64,", re.IGNORECASE)
_ALLOWED_MIME = {"image/png", "image/jpeg", "image/jpg"}
_ALLOWED_FORMATS = {"PNG", "JPEG"}


class ApiError(Exception):
    def __init__(self, status_code: int, message: str):
        super().__init__(message)
        self.status_code = status_code
        self.message = message


@dataclass
class ScoreRequest:
    images: list[Image.Image]
    prompts: list[str]


def parse_score_request(body: bytes, config: OcrServiceConfig) -> ScoreRequest:
    try:
        payload = json.loads(body)
    except (UnicodeDecodeError, ValueError) as exc:
        raise ApiError(400, f"body is not valid JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise ApiError(422, f"body must be a JSON object, got {type(payload).__name__}")
    missing = {"images", "prompts"} - payload.keys()
    extra = payload.keys() - {"images", "prompts"}
    if missing:
        raise ApiError(422, f"missing keys: {sorted(missing)}")
    if extra:
        raise ApiError(422, f"unknown keys: {sorted(extra)} (expected 'images' and 'prompts')")
    images, prompts = payload["images"], payload["prompts"]
    for key, value in (("images", images), ("prompts", prompts)):
        if not isinstance(value, list):
            raise ApiError(422, f"'{key}' must be a list, got {type(value).__name__}")
    if not images:
        raise ApiError(422, "'images' is empty")
    if len(images) != len(prompts):
        raise ApiError(422, f"{len(images)} images but {len(prompts)} prompts")
    if len(images) > config.max_images:
        raise ApiError(413, f"{len(images)} images exceed OCR_MAX_IMAGES={config.max_images}")
    for i, prompt in enumerate(prompts):
        if not isinstance(prompt, str):
            raise ApiError(422, f"prompts[{i}] must be a string, got {type(prompt).__name__}")
        if len(prompt) > config.max_prompt_chars:
            raise ApiError(422, f"prompts[{i}] has {len(prompt)} chars > OCR_MAX_PROMPT_CHARS={config.max_prompt_chars}")
    return ScoreRequest(images=[decode_image(item, i, config) for i, item in enumerate(images)], prompts=prompts)


def decode_image(item: object, index: int, config: OcrServiceConfig) -> Image.Image:
    """base64 PNG/JPEG (optionally a ``data:image/...;base64,`` URL) -> RGB PIL image, within the size limits."""
    where = f"images[{index}]"
    if not isinstance(item, str):
        raise ApiError(422, f"{where} must be a base64 string, got {type(item).__name__}")
    match = _DATA_URL.match(item)
    if match:
        if match.group(1).lower() not in _ALLOWED_MIME:
            raise ApiError(415, f"{where}: data URL type {match.group(1)!r} is not PNG or JPEG")
        item = item[match.end():]
    # base64 inflates by 4/3: reject before decoding what cannot fit.
    if len(item) > (config.max_image_bytes + 2) // 3 * 4 + 4:
        raise ApiError(413, f"{where}: image exceeds OCR_MAX_IMAGE_BYTES={config.max_image_bytes}")
    try:
        raw = base64.b64decode(item, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ApiError(400, f"{where}: not valid base64: {exc}") from None
    if len(raw) > config.max_image_bytes:
        raise ApiError(413, f"{where}: {len(raw)} bytes exceed OCR_MAX_IMAGE_BYTES={config.max_image_bytes}")
    try:
        image = Image.open(io.BytesIO(raw))  # reads the header only
    except Image.DecompressionBombError as exc:
        raise ApiError(413, f"{where}: {exc}") from None
    except Exception as exc:  # PIL raises several types for garbage
        raise ApiError(400, f"{where}: not a decodable image ({type(exc).__name__})") from None
    if image.format not in _ALLOWED_FORMATS:
        raise ApiError(415, f"{where}: format {image.format} is not PNG or JPEG")
    width, height = image.size
    if width < 1 or height < 1 or width * height > config.max_image_pixels:
        raise ApiError(413, f"{where}: {width}x{height} pixels exceed OCR_MAX_IMAGE_PIXELS={config.max_image_pixels}")
    try:
        image.load()
        return image.convert("RGB")
    except Exception as exc:
        raise ApiError(400, f"{where}: image data is corrupt or truncated ({type(exc).__name__}: {exc})") from None
