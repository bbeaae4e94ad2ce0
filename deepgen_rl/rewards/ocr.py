"""``ocr``: client of the OCR reward service (deepgen_rl/services/ocr, ``bash scripts/reward_ocr.sh``) -- the generic
``remote`` reward with OCR's defaults: url ``$OCR_URL`` (http://localhost:18082), ``POST /score``, scores in [0, 1],
the recognised ``texts`` required in every response, no metadata sent (the service's protocol is unchanged).

Score: text-rendering accuracy 1 - Σ edit distance / Σ target length in [0, 1] (see ``ocr_local``). A null score
(prompt without quoted target text) is ``valid=False`` counted in ``info["no_target_text"]``; an image the service
could not OCR (null with a message in ``errors``) is ``valid=False`` alone (``info["image_failed"]``); a batch whose
request finally fails or whose response is malformed is ``valid=False`` (``info["request_failed"]``). No failure
ever becomes a score. ``info["texts"]`` holds the recognised texts.
"""
from __future__ import annotations

import os

from .base import register_reward
from .remote import RemoteReward

DEFAULT_OCR_URL = "http://localhost:18082"


@register_reward("ocr")
class OcrReward(RemoteReward):
    """Text-rendering accuracy in [0, 1] from the OCR service: 1 - Σ edit distance / Σ target length."""

    name = "ocr"
    null_counter = "no_target_text"
    extra_fields = ("texts",)
    send_metadata = False

    def __init__(self, url: str | None = None, **kwargs):
        kwargs.setdefault("score_range", (0.0, 1.0))
        super().__init__(url or os.environ.get("OCR_URL") or DEFAULT_OCR_URL, None, **kwargs)
