"""Parse and validate a ``POST /score`` body; every problem is an :class:`ApiError` with a 4xx status.

Body: ``{"images": [base64 PNG/JPEG or data URL], "prompts": [str], "metadata": [object] (optional)}``.

Status codes: 400 malformed (not JSON, nested deeper than ``max_json_depth``, bad base64, undecodable or truncated
image), 413 too large (body, image count, image bytes, pixels of one image, pixels of the images to score), 415
unsupported media (image not PNG/JPEG), 422 well-formed JSON with the wrong shape (missing/extra keys, wrong types,
empty or mismatched lists, prompt or metadata too long).

Images are handled in two steps so that memory follows what is scored: :func:`parse_score_request` base64-decodes
every image and reads only its header (format and size, no pixels); :meth:`ScoreRequest.decode` then decodes the
images the reward will score, after checking their total pixel count against ``max_request_pixels``.
"""
from __future__ import annotations

import base64
import binascii
import io
import json
import re
from dataclasses import dataclass

from PIL import Image

from .config import ServiceConfig

_DATA_URL = re.compile(r"^data:([\w/+.-]+);base64,", re.IGNORECASE)
_ALLOWED_MIME = {"image/png", "image/jpeg", "image/jpg"}
_ALLOWED_FORMATS = {"PNG", "JPEG"}
_KEYS = {"images", "prompts", "metadata"}
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')  # a JSON string literal (unrolled loop: fast)


class ApiError(Exception):
    """A 4xx answer; ``close``: answer with ``Connection: close`` and close the connection (the 408 body timeout)."""

    def __init__(self, status_code: int, message: str, *, close: bool = False):
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.close = close


@dataclass
class EncodedImage:
    """One request image after base64 decoding and a header read: raw bytes, PIL format, (width, height)."""

    raw: bytes
    format: str
    size: tuple[int, int]


@dataclass
class ScoreRequest:
    images: list[EncodedImage]
    prompts: list[str]
    metadata: list[dict]

    def decode(self, indices: list[int], config: ServiceConfig) -> list[Image.Image]:
        """RGB images for ``indices``; 413 if their total pixels exceed ``max_request_pixels`` (checked first)."""
        total = sum(self.images[i].size[0] * self.images[i].size[1] for i in indices)
        if total > config.max_request_pixels:
            raise ApiError(413, f"the {len(indices)} images to score hold {total} pixels > "
                                f"{config.env('max_request_pixels')}={config.max_request_pixels}")
        return [_decode_pixels(self.images[i], i) for i in indices]


def json_depth_exceeds(body: bytes, limit: int) -> bool:
    """True when ``body`` (JSON text) nests arrays/objects deeper than ``limit`` (brackets inside strings ignored).

    Linear in the body; strings are skipped with a regex so that the scan runs mostly in C.
    """
    stripped = _JSON_STRING.sub(b'""', body)
    depth = 0
    for token in re.finditer(rb"[\[\]{}]", stripped):
        depth += 1 if token.group() in (b"[", b"{") else -1
        if depth > limit:
            return True
    return False


def parse_score_request(body: bytes, config: ServiceConfig) -> ScoreRequest:
    if json_depth_exceeds(body, config.max_json_depth):
        raise ApiError(400, f"body nests JSON deeper than {config.env('max_json_depth')}={config.max_json_depth}")
    try:
        payload = json.loads(body)
    except RecursionError:  # belt and braces: the depth scan above should have caught it
        raise ApiError(400, "body nests JSON too deeply") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise ApiError(400, f"body is not valid JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise ApiError(422, f"body must be a JSON object, got {type(payload).__name__}")
    missing = {"images", "prompts"} - payload.keys()
    extra = payload.keys() - _KEYS
    if missing:
        raise ApiError(422, f"missing keys: {sorted(missing)}")
    if extra:
        raise ApiError(422, f"unknown keys: {sorted(extra)} (expected 'images', 'prompts' and optional 'metadata')")
    images, prompts = payload["images"], payload["prompts"]
    metadata = payload.get("metadata", [{} for _ in prompts] if isinstance(prompts, list) else None)
    for key, value in (("images", images), ("prompts", prompts), ("metadata", metadata)):
        if not isinstance(value, list):
            raise ApiError(422, f"'{key}' must be a list, got {type(value).__name__}")
    if not images:
        raise ApiError(422, "'images' is empty")
    if not (len(images) == len(prompts) == len(metadata)):
        raise ApiError(422, f"{len(images)} images but {len(prompts)} prompts and {len(metadata)} metadata entries")
    if len(images) > config.max_images:
        raise ApiError(413, f"{len(images)} images exceed {config.env('max_images')}={config.max_images}")
    for i, prompt in enumerate(prompts):
        if not isinstance(prompt, str):
            raise ApiError(422, f"prompts[{i}] must be a string, got {type(prompt).__name__}")
        if len(prompt) > config.max_prompt_chars:
            raise ApiError(422, f"prompts[{i}] has {len(prompt)} chars > "
                                f"{config.env('max_prompt_chars')}={config.max_prompt_chars}")
    for i, meta in enumerate(metadata):
        if not isinstance(meta, dict):
            raise ApiError(422, f"metadata[{i}] must be an object, got {type(meta).__name__}")
        if len(json.dumps(meta)) > config.max_metadata_chars:
            raise ApiError(422, f"metadata[{i}] exceeds {config.env('max_metadata_chars')}={config.max_metadata_chars}")
    return ScoreRequest(images=[read_image_header(item, i, config) for i, item in enumerate(images)],
                        prompts=prompts, metadata=metadata)


def read_image_header(item: object, index: int, config: ServiceConfig) -> EncodedImage:
    """base64 PNG/JPEG (optionally a ``data:image/...;base64,`` URL) -> bytes + header, within the size limits."""
    where = f"images[{index}]"
    if not isinstance(item, str):
        raise ApiError(422, f"{where} must be a base64 string, got {type(item).__name__}")
    match = _DATA_URL.match(item)
    if match:
        if match.group(1).lower() not in _ALLOWED_MIME:
            raise ApiError(415, f"{where}: data URL type {match.group(1)!r} is not PNG or JPEG")
        item = item[match.end():]
    limit_name = config.env("max_image_bytes")
    # base64 inflates by 4/3: reject before decoding what cannot fit.
    if len(item) > (config.max_image_bytes + 2) // 3 * 4 + 4:
        raise ApiError(413, f"{where}: image exceeds {limit_name}={config.max_image_bytes}")
    try:
        raw = base64.b64decode(item, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ApiError(400, f"{where}: not valid base64: {exc}") from None
    if len(raw) > config.max_image_bytes:
        raise ApiError(413, f"{where}: {len(raw)} bytes exceed {limit_name}={config.max_image_bytes}")
    try:
        with Image.open(io.BytesIO(raw)) as image:  # reads the header only
            fmt, (width, height) = image.format, image.size
    except Image.DecompressionBombError as exc:
        raise ApiError(413, f"{where}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - PIL raises several types for garbage
        raise ApiError(400, f"{where}: not a decodable image ({type(exc).__name__})") from None
    if fmt not in _ALLOWED_FORMATS:
        raise ApiError(415, f"{where}: format {fmt} is not PNG or JPEG")
    if width < 1 or height < 1 or width * height > config.max_image_pixels:
        raise ApiError(413, f"{where}: {width}x{height} pixels exceed "
                            f"{config.env('max_image_pixels')}={config.max_image_pixels}")
    return EncodedImage(raw=raw, format=fmt, size=(width, height))


def _decode_pixels(encoded: EncodedImage, index: int) -> Image.Image:
    try:
        with Image.open(io.BytesIO(encoded.raw)) as image:
            image.load()
            return image.convert("RGB")
    except Exception as exc:  # noqa: BLE001
        raise ApiError(400, f"images[{index}]: image data is corrupt or truncated ({type(exc).__name__}: {exc})") \
            from None
