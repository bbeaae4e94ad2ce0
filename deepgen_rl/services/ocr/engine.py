"""Thin wrapper around rapidocr_onnxruntime: one engine per thread (RapidOCR objects are not documented as
thread-safe), recognised lines in reading order."""
from __future__ import annotations

import threading

import numpy as np
from PIL import Image

_local = threading.local()
_ort_threads = -1  # onnxruntime intra-op threads per engine; -1 = onnxruntime's default (all cores)


def set_onnxruntime_threads(num_threads: int) -> None:
    """Intra-op threads of engines created from now on (-1: onnxruntime default)."""
    global _ort_threads
    _ort_threads = int(num_threads)


def _engine():
    engine = getattr(_local, "engine", None)
    if engine is None:
        from rapidocr_onnxruntime import RapidOCR  # heavy import, only where OCR runs

        kwargs = {} if _ort_threads < 1 else {"intra_op_num_threads": _ort_threads}
        engine = _local.engine = RapidOCR(**kwargs)
    return engine


def recognize_lines(image: Image.Image) -> list[str]:
    """OCR text lines of ``image`` (RGB), top-to-bottom as returned by the detector; [] when nothing is found."""
    result, _ = _engine()(np.asarray(image.convert("RGB")))
    return [str(line[1]) for line in (result or [])]


def recognize_text(image: Image.Image) -> str:
    """All recognised lines joined with a single space."""
    return " ".join(recognize_lines(image))
