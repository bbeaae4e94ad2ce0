"""``ocr_vlm``: text-rendering accuracy with any OpenAI-compatible VLM endpoint as the OCR engine.

The VLM (``$OCR_VLM_URL``, model ``$OCR_VLM_MODEL_NAME``) is asked to transcribe every piece of text in the image;
its answer is scored exactly like ``ocr``: score = 1 - Σ_t d(t) / Σ_t len(t) in [0, 1] over the prompt's quoted
target segments (:func:`deepgen_rl.services.ocr.scoring.ocr_score`). A prompt without quoted text is ``valid=False``
and costs no request (``info["num_skipped_no_target"]``). The answer "NONE" means no text (transcription ""). Failed
requests are ``valid=False`` (see :mod:`deepgen_rl.rewards.vlm`). Each image is its own request: batch-size invariant.
"""
from __future__ import annotations

from deepgen_rl.services.ocr.scoring import extract_target_texts, ocr_score

from .base import register_reward
from .vlm import PointwiseVlmReward

TRANSCRIBE_INSTRUCTION = (
    "Transcribe all the text that is visible in this image, exactly as written, in reading order. Answer with the "
    "transcribed text only, without quotes or comments. If the image contains no text, answer NONE."
)


def transcription(answer: str) -> str:
    text = answer.rsplit("</think>", 1)[-1].strip()
    return "" if text.upper() == "NONE" else text


@register_reward("ocr_vlm")
class VlmOcrReward(PointwiseVlmReward):
    name = "ocr_vlm"
    url_env, model_env = "OCR_VLM_URL", "OCR_VLM_MODEL_NAME"
    default_url, default_model = "http://localhost:18088", "ocr"

    def wants(self, prompt, meta):
        return bool(extract_target_texts(prompt))

    def instruction(self, prompt, meta):
        return TRANSCRIBE_INSTRUCTION

    def parse(self, answer, prompt, meta):
        text = transcription(answer)
        return ocr_score(prompt, text), {"texts": text}
