"""``geneval``: GenEval-style compositional correctness from object detections and the prompt's metadata.

Metadata (GenEval's ``evaluation_metadata.jsonl`` format, per sample): ``tag`` and ``include``: a list of
``{"class": str, "count": int, "color": str (optional), "position": [relation, j] (optional)}`` and optionally
``exclude``: ``[{"class": str, "count": int}]``. Requirements, each checked on the detections of its class with
score >= ``threshold`` (``counting_threshold`` for tag "counting"), after per-class NMS (IoU > ``nms_iou``):

* include count: at least ``count`` detections;               * exclude: fewer than ``count`` detections;
* color: the ``count`` most confident detections all have ``color`` (from the :class:`ColorClassifier`);
* position ``[rel, j]``: some detection of this class stands in ``rel`` ("left of", "right of", "above", "below")
  to some detection of ``include[j]``'s class. With centres c, sizes (w, h) and t = ``position_threshold``:
  o = c_a − c_b; a is "right of" b iff o_x > t·(w_a + w_b), "left of" iff o_x < −t·(w_a + w_b); "below"/"above"
  likewise on y with heights (image y grows downwards).

score = 1.0 if every requirement holds else 0.0 (GenEval's per-image correctness), or with ``partial=True`` the
fraction of requirements that hold; range [0, 1]. Metadata without an ``include`` list falls back to
:func:`parse_geneval_prompt` (GenEval's six prompt templates, so a plain list of GenEval prompts trains too); a
prompt that matches none is ``valid=False`` with the reason in ``info["image_errors"]``. A detector failure raises
(the whole call is invalid). Each image is detected
alone: batch-size invariant.

Detector: any :class:`Detector`; the real one is :class:`Owlv2Detector` (transformers OWLv2, open vocabulary) from
``$GENEVAL_DETECTOR_PATH`` (e.g. google/owlv2-base-patch16-ensemble). Colours: :class:`MeanColorClassifier` (nearest
reference colour to the mean RGB of the box's central half), a stand-in for GenEval's CLIP colour classifier.
"""
from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np
import torch

from .base import Reward, register_reward

ENV_VAR = "GENEVAL_DETECTOR_PATH"
RELATIONS = ("left of", "right of", "above", "below")
REFERENCE_COLORS = {  # sRGB reference of GenEval's colour names
    "red": (220, 30, 30), "orange": (245, 140, 20), "yellow": (240, 220, 30), "green": (40, 160, 50),
    "blue": (30, 70, 210), "purple": (130, 50, 170), "pink": (245, 150, 190), "brown": (120, 75, 35),
    "black": (15, 15, 15), "white": (240, 240, 240),
}


@dataclass(frozen=True)
class Detection:
    """One detected object: class name, confidence in [0, 1], box (x0, y0, x1, y1) in pixels."""

    label: str
    score: float
    box: tuple[float, float, float, float]


class Detector(Protocol):
    def detect(self, image, classes: Sequence[str]) -> list[Detection]:
        """Detections of ``classes`` (open-vocabulary names) in ``image`` (PIL), any confidence."""


class ColorClassifier(Protocol):
    def classify(self, image, box: tuple[float, float, float, float], colors: Sequence[str]) -> str:
        """The name in ``colors`` that best describes the object in ``box``."""


class MeanColorClassifier:
    """Nearest reference colour (Euclidean in RGB) to the mean colour of the box's central half."""

    def classify(self, image, box, colors):
        x0, y0, x1, y1 = box
        cx0, cx1 = x0 + (x1 - x0) / 4, x1 - (x1 - x0) / 4
        cy0, cy1 = y0 + (y1 - y0) / 4, y1 - (y1 - y0) / 4
        crop = image.convert("RGB").crop((int(cx0), int(cy0), max(int(cx0) + 1, int(round(cx1))),
                                          max(int(cy0) + 1, int(round(cy1)))))
        mean = np.asarray(crop, dtype=np.float64).reshape(-1, 3).mean(axis=0)
        known = [c for c in colors if c in REFERENCE_COLORS]
        if not known:
            raise ValueError(f"geneval: no reference RGB for colours {list(colors)}; known: {sorted(REFERENCE_COLORS)}")
        return min(known, key=lambda c: float(((mean - np.asarray(REFERENCE_COLORS[c])) ** 2).sum()))


def box_iou(a, b) -> float:
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def nms(detections: list[Detection], iou: float) -> list[Detection]:
    """Greedy per-class non-maximum suppression, most confident first."""
    kept: list[Detection] = []
    for det in sorted(detections, key=lambda d: -d.score):
        if all(k.label != det.label or box_iou(k.box, det.box) <= iou for k in kept):
            kept.append(det)
    return kept


def relations(a: Detection, b: Detection, threshold: float) -> set[str]:
    """The relations a stands in to b (see the module docstring for the formula)."""
    ca = ((a.box[0] + a.box[2]) / 2, (a.box[1] + a.box[3]) / 2)
    cb = ((b.box[0] + b.box[2]) / 2, (b.box[1] + b.box[3]) / 2)
    wa, ha = a.box[2] - a.box[0], a.box[3] - a.box[1]
    wb, hb = b.box[2] - b.box[0], b.box[3] - b.box[1]
    ox, oy = ca[0] - cb[0], ca[1] - cb[1]
    out = set()
    if ox > threshold * (wa + wb):
        out.add("right of")
    elif ox < -threshold * (wa + wb):
        out.add("left of")
    if oy > threshold * (ha + hb):
        out.add("below")
    elif oy < -threshold * (ha + hb):
        out.add("above")
    return out


def evaluate(image, detections: list[Detection], meta: dict, *, threshold: float = 0.3,
             counting_threshold: float | None = None, nms_iou: float = 0.5, position_threshold: float = 0.1,
             colors: ColorClassifier | None = None) -> tuple[int, int, list[str]]:
    """(requirements passed, requirements checked, reasons for failures) for one image."""
    include, exclude = meta.get("include"), meta.get("exclude", [])
    if not isinstance(include, list) or not include:
        raise ValueError("metadata has no GenEval 'include' list")
    cut = counting_threshold if (meta.get("tag") == "counting" and counting_threshold is not None) else threshold
    kept = nms([d for d in detections if d.score >= cut], nms_iou)
    by_class = {}
    for det in kept:
        by_class.setdefault(det.label, []).append(det)
    colors = colors or MeanColorClassifier()
    passed, checked, failures = 0, 0, []

    def check(ok: bool, reason: str) -> None:
        nonlocal passed, checked
        checked += 1
        passed += int(ok)
        if not ok:
            failures.append(reason)

    for req in include:
        found = by_class.get(req["class"], [])
        need = int(req.get("count", 1))
        check(len(found) >= need, f"expected >= {need} {req['class']}, found {len(found)}")
        if "color" in req:
            top = found[:need]
            named = [colors.classify(image, d.box, list(REFERENCE_COLORS)) for d in top]
            check(len(top) >= need and all(c == req["color"] for c in named),
                  f"expected {req['color']} {req['class']}, found {named}")
        if "position" in req:
            relation, j = req["position"][0], int(req["position"][1])
            if relation not in RELATIONS:
                raise ValueError(f"unknown relation {relation!r}; expected one of {RELATIONS}")
            reference = by_class.get(include[j]["class"], [])
            ok = any(relation in relations(a, b, position_threshold) for a in found for b in reference if a is not b)
            check(ok, f"expected {req['class']} {relation} {include[j]['class']}")
    for req in exclude:
        found = by_class.get(req["class"], [])
        check(len(found) < int(req["count"]), f"expected < {req['count']} {req['class']}, found {len(found)}")
    return passed, checked, failures


_ART = r"(?:a|an)"
_NUMBERS = {"two": 2, "three": 3, "four": 4}


def _object(text: str) -> dict:
    first, _, rest = text.partition(" ")
    if first in REFERENCE_COLORS and rest:
        return {"class": rest, "count": 1, "color": first}
    return {"class": text, "count": 1}


def parse_geneval_prompt(prompt: str) -> dict | None:
    """GenEval metadata from a prompt written in one of GenEval's templates, else None.

    "a photo of a/an X" (single object, "X" may start with a colour: colors), "a photo of a/an X and a/an Y"
    (two objects, each optionally coloured: color_attr), "a photo of two|three|four Xs" (counting: include n,
    exclude n + 1), "a photo of a/an Y left of|right of|above|below a/an X" (position: Y relative to X). Class names
    are the noun phrases as written (plurals too: they only name detector queries).
    """
    text = prompt.strip().lower().rstrip(".")
    if m := re.fullmatch(rf"a photo of {_ART} (.+?) (left of|right of|above|below) {_ART} (.+)", text):
        return {"tag": "position", "include": [{"class": m.group(3), "count": 1},
                                               {"class": m.group(1), "count": 1, "position": [m.group(2), 0]}]}
    if m := re.fullmatch(r"a photo of (two|three|four) (.+)", text):
        n = _NUMBERS[m.group(1)]
        return {"tag": "counting", "include": [{"class": m.group(2), "count": n}],
                "exclude": [{"class": m.group(2), "count": n + 1}]}
    if m := re.fullmatch(rf"a photo of {_ART} (.+) and {_ART} (.+)", text):
        first, second = _object(m.group(1)), _object(m.group(2))
        return {"tag": "color_attr" if "color" in first or "color" in second else "two_object",
                "include": [first, second]}
    if m := re.fullmatch(rf"a photo of {_ART} (.+)", text):
        obj = _object(m.group(1))
        return {"tag": "colors" if "color" in obj else "single_object", "include": [obj]}
    return None


class Owlv2Detector:
    """transformers OWLv2 from ``path``: one forward per image with the queries ``"a photo of a <class>"``."""

    def __init__(self, path: str, device: str | None = None, dtype: torch.dtype = torch.float32):
        from transformers import Owlv2ForObjectDetection, Owlv2Processor

        try:
            self.model = Owlv2ForObjectDetection.from_pretrained(path, dtype=dtype).eval().requires_grad_(False)
            self.processor = Owlv2Processor.from_pretrained(path)
        except (OSError, ValueError) as exc:
            raise OSError(f"geneval: cannot load an OWLv2 detector + processor from {path!r} (${ENV_VAR}): {exc}") \
                from exc
        self.device = torch.device(device or "cpu")
        self.model.to(self.device)
        self._lock = threading.Lock()

    @torch.no_grad()
    def detect(self, image, classes):
        classes = list(dict.fromkeys(classes))
        image = image.convert("RGB")
        with self._lock:
            inputs = self.processor(text=[[f"a photo of a {c}" for c in classes]], images=[image],
                                    return_tensors="pt").to(self.device)
            outputs = self.model(**inputs)
        side = max(image.size)  # OWLv2 pads to a square before resizing: boxes are relative to the padded image
        result = self.processor.post_process_grounded_object_detection(
            outputs, threshold=0.0, target_sizes=torch.tensor([[side, side]]))[0]
        return [Detection(classes[int(label)], float(score), tuple(float(v) for v in box))
                for score, label, box in zip(result["scores"], result["labels"], result["boxes"])]


@register_reward("geneval")
class GenEvalReward(Reward):
    name = "geneval"

    def __init__(self, detector_path: str | None = None, *, detector: Detector | None = None,
                 device: str | None = None, threshold: float = 0.3, counting_threshold: float | None = None,
                 nms_iou: float = 0.5, position_threshold: float = 0.1, partial: bool = False,
                 colors: ColorClassifier | None = None, parse_prompts: bool = True):
        self.parse_prompts = parse_prompts
        if detector is None:
            path = detector_path or os.environ.get(ENV_VAR)
            if not path:
                raise ValueError(f"geneval: no detector given; set ${ENV_VAR} or pass detector_path (an OWLv2 model)")
            detector = Owlv2Detector(path, device)
        self.detector, self.partial, self.colors = detector, partial, colors or MeanColorClassifier()
        self.options = dict(threshold=threshold, counting_threshold=counting_threshold, nms_iou=nms_iou,
                            position_threshold=position_threshold)

    def score(self, images, prompts, metadata):
        n = len(images)
        scores, valid = torch.zeros(n), torch.zeros(n, dtype=torch.bool)
        info = {"image_errors": [None] * n, "failures": [[] for _ in range(n)]}
        for i, (image, prompt, meta) in enumerate(zip(images, prompts, metadata)):
            include = meta.get("include")
            if not isinstance(include, list) or not include:
                parsed = parse_geneval_prompt(prompt) if self.parse_prompts else None
                if parsed is None:
                    info["image_errors"][i] = ("geneval: metadata has no GenEval 'include' list and the prompt "
                                               "matches no GenEval template")
                    continue
                meta, include = parsed, parsed["include"]
            classes = [r["class"] for r in include] + [r["class"] for r in meta.get("exclude", [])]
            detections = self.detector.detect(image, classes)
            passed, checked, failures = evaluate(image, detections, meta, colors=self.colors, **self.options)
            info["failures"][i] = failures
            scores[i] = passed / checked if self.partial else float(passed == checked)
            valid[i] = True
        return scores, valid, info
