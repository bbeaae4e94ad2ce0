"""Pure OCR scoring: target text from the prompt, best-substring edit distance, score in [0, 1].

* Target text = every double-quoted segment of the prompt, straight ``"..."`` or curly ``“...”``, in order of
  appearance. A quote without a partner is ignored; a straight quote never pairs with a curly one; single quotes are
  not delimiters (they are apostrophes in most prompts).
* Normalisation (targets and recognised text): Unicode NFKC, ``casefold()`` and removal of all whitespace. OCR
  engines add/drop spaces and change case freely; we reward spelling the characters, not spacing or case.
  Segments that normalise to "" are dropped.
* Recognised text = the OCR lines joined in reading order (after normalisation the separator vanishes, so a target
  may span two lines).
* Per segment t: d(t) = min over substrings s of the recognised text of Levenshtein(t, s) (exact approximate
  substring matching, Sellers' DP, O(len(t)·len(text))). 0 <= d(t) <= len(t) (the empty substring costs len(t)).
* score = clip(1 - Σ_t d(t) / Σ_t len(t), 0, 1); ``None`` when the prompt holds no target text.
"""
from __future__ import annotations

import re
import unicodedata

_QUOTED = re.compile(r'"([^"]*)"|“([^”]*)”')
_WHITESPACE = re.compile(r"\s+")


def extract_target_texts(prompt: str) -> list[str]:
    """Quoted segments of ``prompt`` (raw, not normalised), in order; segments empty after normalisation dropped."""
    segments = [m.group(1) if m.group(1) is not None else m.group(2) for m in _QUOTED.finditer(prompt)]
    return [s for s in segments if normalize_text(s)]


def normalize_text(text: str) -> str:
    """NFKC, casefold, drop all whitespace."""
    return _WHITESPACE.sub("", unicodedata.normalize("NFKC", text).casefold())


def best_substring_distance(target: str, text: str) -> int:
    """min over all substrings s of ``text`` (including "") of Levenshtein(target, s).

    DP over target prefixes i and text positions j where row 0 is all zeros (a match may start anywhere in
    ``text``) and the answer is the minimum of the last row (it may end anywhere).
    """
    if not target:
        return 0
    previous = [0] * (len(text) + 1)
    for i, tc in enumerate(target, start=1):
        current = [i] + [0] * len(text)
        for j, xc in enumerate(text, start=1):
            current[j] = min(previous[j - 1] + (tc != xc), previous[j] + 1, current[j - 1] + 1)
        previous = current
    return min(previous)


def ocr_score(prompt: str, recognized_text: str) -> float | None:
    """1 - Σd/Σlen over the prompt's target segments against ``recognized_text``; None without target text."""
    targets = [normalize_text(t) for t in extract_target_texts(prompt)]
    if not targets:
        return None
    text = normalize_text(recognized_text)
    total_distance = sum(best_substring_distance(t, text) for t in targets)
    total_length = sum(len(t) for t in targets)
    return min(1.0, max(0.0, 1.0 - total_distance / total_length))
