"""``unifiedreward``: pointwise UnifiedReward (alignment + style) through a vLLM OpenAI-compatible endpoint.

Each image is judged alone against its caption (``$UNIFIEDREWARD_URL``, default http://localhost:18086, model
``$UNIFIEDREWARD_MODEL_NAME``). The judge answers with two lines ``Alignment Score: a`` and ``Style Score: s``,
a and s in [1, 5] (decimals allowed; the last occurrence after any ``</think>`` counts).

score = w·(a − 1)/4 + (1 − w)·(s − 1)/4 in [0, 1], w = ``alignment_weight`` (default 0.5). An answer missing either
score, or with one outside [1, 5], is unparseable: ``valid=False``, counted in ``info["num_unparseable"]``, never a
guess. Per-image ``alignment`` and ``style`` are in ``info``. One request per image: batch-size invariant.
"""
from __future__ import annotations

import re

from .base import register_reward
from .vlm import PointwiseVlmReward

POINTWISE_INSTRUCTION = (
    "You are an expert judge of text-to-image generation. Look at the image generated for the caption below.\n"
    "Caption: {prompt}\n\n"
    "Rate two aspects on a scale from 1 (worst) to 5 (best): Alignment -- how faithfully the image depicts every "
    "element of the caption (objects, counts, attributes, relations, text); Style -- its aesthetic and technical "
    "quality (composition, lighting, detail, absence of artifacts). Reason briefly, then end your answer with exactly "
    "two lines:\nAlignment Score: <1-5>\nStyle Score: <1-5>"
)

_ALIGNMENT = re.compile(r"alignment\s*score\s*[:：]\s*\**\s*([0-9]+(?:\.[0-9]+)?)", re.IGNORECASE)
_STYLE = re.compile(r"style\s*score\s*[:：]\s*\**\s*([0-9]+(?:\.[0-9]+)?)", re.IGNORECASE)


def parse_pointwise_answer(text: str) -> tuple[float, float] | None:
    """(alignment, style), each in [1, 5], from the last occurrences after any </think>; None if unparseable."""
    if not isinstance(text, str):
        return None
    tail = text.rsplit("</think>", 1)[-1]
    alignment, style = _ALIGNMENT.findall(tail), _STYLE.findall(tail)
    if not alignment or not style:
        return None
    a, s = float(alignment[-1]), float(style[-1])
    return (a, s) if 1.0 <= a <= 5.0 and 1.0 <= s <= 5.0 else None


@register_reward("unifiedreward")
class UnifiedRewardPointwise(PointwiseVlmReward):
    name = "unifiedreward"
    url_env, model_env = "UNIFIEDREWARD_URL", "UNIFIEDREWARD_MODEL_NAME"
    default_url, default_model = "http://localhost:18086", "UnifiedReward"

    def __init__(self, url: str | None = None, model_name: str | None = None, *, alignment_weight: float = 0.5,
                 **kwargs):
        if not 0.0 <= alignment_weight <= 1.0:
            raise ValueError(f"unifiedreward: alignment_weight must be in [0, 1], got {alignment_weight}")
        super().__init__(url, model_name, **kwargs)
        self.alignment_weight = float(alignment_weight)

    def instruction(self, prompt, meta):
        return POINTWISE_INSTRUCTION.format(prompt=prompt)

    def parse(self, answer, prompt, meta):
        parsed = parse_pointwise_answer(answer)
        if parsed is None:
            return None, {}
        a, s = parsed
        w = self.alignment_weight
        return w * (a - 1.0) / 4.0 + (1.0 - w) * (s - 1.0) / 4.0, {"alignment": a, "style": s}
