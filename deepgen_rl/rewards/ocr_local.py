"""``ocr_local``: text-rendering accuracy with RapidOCR in this process (what the OCR service hosts).

score = 1 - Σ_t d(t) / Σ_t len(t) in [0, 1] over the prompt's quoted target segments t, d = best-substring edit
distance against the recognised text (formula and normalisation: :mod:`deepgen_rl.services.ocr.scoring`).
A prompt without quoted text is ``valid=False`` with no error (nothing to score); an image whose OCR raises (RapidOCR
raises ``ResizeImgError`` on a 1x4000 image) is ``valid=False`` with ``info["image_errors"][i]`` set. Per-image work,
so batch-size invariant. ``info["texts"][i]`` is the recognised text ("" when not OCR'd).
"""
from __future__ import annotations

import torch

from .base import Reward, register_reward


def _describe(exc: BaseException) -> str:
    message = str(exc).strip()
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


@register_reward("ocr_local")
class LocalOcrReward(Reward):
    name = "ocr_local"

    def wants(self, prompt, meta):
        from deepgen_rl.services.ocr.scoring import extract_target_texts

        return bool(extract_target_texts(prompt))

    def score(self, images, prompts, metadata):
        from deepgen_rl.services.ocr import engine
        from deepgen_rl.services.ocr.scoring import ocr_score

        n = len(images)
        scores, valid = torch.zeros(n), torch.zeros(n, dtype=torch.bool)
        texts, errors = [""] * n, [None] * n
        for i, (image, prompt) in enumerate(zip(images, prompts)):
            if not self.wants(prompt, metadata[i]):
                continue
            try:
                text = engine.recognize_text(image)
                value = ocr_score(prompt, text)
            except Exception as exc:  # noqa: BLE001 - any per-image failure becomes that image's error
                errors[i] = _describe(exc)
                continue
            texts[i], scores[i], valid[i] = text, value, True
        return scores, valid, {"texts": texts, "image_errors": errors}
