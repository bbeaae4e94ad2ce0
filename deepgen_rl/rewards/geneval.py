"""``geneval``: GenEval-style compositional correctness from object detections and the prompt's metadata.

Metadata (GenEval's ``evaluation_metadata.jsonl`` format, per sample): ``tag`` and ``include``: a list of
``{"class": str, "count": int, "color": str (optional), "position": [relation, j] (optional)}`` and optionally
``exclude``: ``[{"class": str, "count": int}]``. GenEval's rules (Ghosh et al. 2023, its ``evaluate_images.py``):

* detections of each class with score > ``threshold`` (0.3; ``counting_threshold``, 0.9, for tag "counting"), most
  confident first, at most ``max_objects`` (16) per class, then greedy per-class NMS (drop IoU >= ``nms_iou``);
* include: at least ``count`` detections; the group's objects are its ``count`` most confident ones;
* color: all of the group's objects have ``color`` (from the :class:`ColorClassifier`; checked only if the count
  holds, else it fails with it);
* position ``[rel, j]`` (checked only if count and colour hold): group j matched, and EVERY object a of this group
  stands in ``rel`` to EVERY object b of group j. With centres c, box sizes d = (w, h), t = ``position_threshold``
  (0.1), offset o = c_a − c_b: r = max(|o| − t·(d_a + d_b), 0)·sign(o) (per axis); no relation if |r| < 1e-3 on both
  axes; else (x, y) = r / ‖o‖ and "left of" iff x < −0.5, "right of" iff x > 0.5, "above" iff y < −0.5, "below" iff
  y > 0.5 (image y grows downwards);
* exclude: fewer than ``count`` detections.

score = 1.0 if every requirement holds else 0.0 (GenEval's per-image correctness), or with ``partial=True`` the
fraction of requirements that hold (count, colour, position, exclude each count once); range [0, 1]. Metadata without
an ``include`` list falls back to :func:`parse_geneval_prompt` (GenEval's prompt templates, so a plain list of GenEval
prompts trains too); a sample with neither is "nothing to score" (``wants`` is False: ``valid=False`` with no error,
counted in ``info["num_skipped_no_metadata"]``; the reward server does not decode it). A detector failure raises (the
whole call is invalid). Each image is detected alone: batch-size invariant.

Detector: any :class:`Detector`; the real one is :class:`Owlv2Detector` (transformers OWLv2, open vocabulary) from
``$GENEVAL_DETECTOR_PATH`` (e.g. google/owlv2-base-patch16-ensemble); GenEval itself uses a Mask2Former trained on
COCO (no NMS needed there, so GenEval applies none by default; OWLv2 predicts one box per patch and needs it).
Colours: :class:`ClipColorClassifier` (GenEval's method: CLIP zero-shot over its 10 colour names with three prompt
templates, on the crop of the box) when ``color_model_name_or_path`` / ``$GENEVAL_COLOR_MODEL_NAME_OR_PATH`` is set
(GenEval uses CLIP ViT-L/14), else :class:`MeanColorClassifier` (nearest reference colour to the mean RGB of the
box's central half), a model-free stand-in. Differences from GenEval are listed in docs/rewards.md.
"""
from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np
import torch

from .base import Reward, WeightPath, register_reward

ENV_VAR = "GENEVAL_DETECTOR_PATH"
COLOR_ENV_VAR = "GENEVAL_COLOR_MODEL_NAME_OR_PATH"
RELATIONS = ("left of", "right of", "above", "below")
REFERENCE_COLORS = {  # GenEval's 10 colour names (its order), with an sRGB reference for the mean-colour stand-in
    "red": (220, 30, 30), "orange": (245, 140, 20), "yellow": (240, 220, 30), "green": (40, 160, 50),
    "blue": (30, 70, 210), "purple": (130, 50, 170), "pink": (245, 150, 190), "brown": (120, 75, 35),
    "black": (15, 15, 15), "white": (240, 240, 240),
}
COLOR_TEMPLATES = ("a photo of a {color} {cls}", "a photo of a {color}-colored {cls}", "a photo of a {color} object")


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
    def classify(self, image, box: tuple[float, float, float, float], colors: Sequence[str],
                 cls: str = "object") -> str:
        """The name in ``colors`` that best describes the object of class ``cls`` in ``box``."""


class MeanColorClassifier:
    """Nearest reference colour (Euclidean in RGB) to the mean colour of the box's central half."""

    def classify(self, image, box, colors, cls="object"):
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


class ClipColorClassifier:
    """GenEval's colour classifier on transformers CLIP: zero-shot over ``colors`` on the crop of the box.

    Text weight of colour c for class k: normalise(mean_t normalise(E_text(template_t(c, k)))) over
    :data:`COLOR_TEMPLATES`; the answer is argmax_c cos(E_image(crop), weight_c). Weights are cached per class.
    """

    def __init__(self, path: str | None = None, device: str | None = None):
        from .clip_common import load_clip, load_processor, resolve_path

        path = resolve_path("geneval", path, COLOR_ENV_VAR, kwarg="color_model_name_or_path")
        self.model = load_clip("geneval", path, COLOR_ENV_VAR)
        self.tokenizer, self.image_processor = load_processor("geneval", path, COLOR_ENV_VAR)
        self.device = torch.device(device or "cpu")
        self.model.to(self.device)
        self._weights: dict[tuple[str, tuple[str, ...]], torch.Tensor] = {}
        self._lock = threading.Lock()

    def text_weights(self, cls: str, colors: Sequence[str]) -> torch.Tensor:
        """FloatTensor[len(colors), D] fp32, rows L2-normalised."""
        from .clip_common import text_embeddings

        key = (cls, tuple(colors))
        if key not in self._weights:
            rows = []
            for color in colors:
                emb = text_embeddings(self.model, self.tokenizer,
                                      [t.format(color=color, cls=cls) for t in COLOR_TEMPLATES], self.device)
                rows.append(torch.nn.functional.normalize(emb.mean(0), dim=-1))
            self._weights[key] = torch.stack(rows)
        return self._weights[key]

    @torch.no_grad()
    def classify(self, image, box, colors, cls="object"):
        from .clip_common import image_embeddings

        x0, y0, x1, y1 = box
        crop = image.convert("RGB").crop((int(x0), int(y0), max(int(x0) + 1, int(round(x1))),
                                          max(int(y0) + 1, int(round(y1)))))
        with self._lock:
            weights = self.text_weights(cls, colors)
            emb = image_embeddings(self.model, self.image_processor, [crop], self.device)
        return list(colors)[int((emb @ weights.T).argmax())]


def box_iou(a, b) -> float:
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def select_detections(detections: list[Detection], threshold: float, max_objects: int = 16,
                      nms_iou: float = 0.5) -> dict[str, list[Detection]]:
    """{class: kept detections, most confident first}: score > ``threshold``, the ``max_objects`` most confident
    of each class, then greedy NMS within the class (a detection with IoU >= ``nms_iou`` to a kept one is dropped;
    ``nms_iou=1`` keeps all, as GenEval does by default)."""
    by_class: dict[str, list[Detection]] = {}
    for det in sorted((d for d in detections if d.score > threshold), key=lambda d: -d.score):
        by_class.setdefault(det.label, []).append(det)
    kept = {}
    for label, dets in by_class.items():
        todo, out = dets[:max_objects], []
        while todo:
            best = todo.pop(0)
            out.append(best)
            todo = [d for d in todo if nms_iou >= 1 or box_iou(best.box, d.box) < nms_iou]
        kept[label] = out
    return kept


def relations(a: Detection, b: Detection, threshold: float) -> set[str]:
    """The relations a stands in to b: GenEval's rule (formula in the module docstring)."""
    ca = np.array([(a.box[0] + a.box[2]) / 2, (a.box[1] + a.box[3]) / 2])
    cb = np.array([(b.box[0] + b.box[2]) / 2, (b.box[1] + b.box[3]) / 2])
    dims = np.array([abs(a.box[2] - a.box[0]) + abs(b.box[2] - b.box[0]),
                     abs(a.box[3] - a.box[1]) + abs(b.box[3] - b.box[1])])
    offset = ca - cb
    revised = np.maximum(np.abs(offset) - threshold * dims, 0) * np.sign(offset)
    if np.all(np.abs(revised) < 1e-3):
        return set()
    dx, dy = revised / np.linalg.norm(offset)
    out = set()
    if dx < -0.5:
        out.add("left of")
    if dx > 0.5:
        out.add("right of")
    if dy < -0.5:
        out.add("above")
    if dy > 0.5:
        out.add("below")
    return out


def metadata_problem(meta: dict) -> str | None:
    """What is wrong with a GenEval metadata record (``include`` / ``exclude`` entries), or None when it is usable."""
    include, exclude = meta.get("include"), meta.get("exclude", [])
    if not isinstance(include, list) or not include or not isinstance(exclude, list):
        return "'include' must be a non-empty list and 'exclude' a list"
    for where, entries in (("include", include), ("exclude", exclude)):
        for k, req in enumerate(entries):
            if not isinstance(req, dict) or not isinstance(req.get("class"), str):
                return f"{where}[{k}] needs a 'class' string, got {req!r}"
            count = req.get("count", 1 if where == "include" else None)
            if isinstance(count, bool) or not isinstance(count, int) or count < 1:
                return f"{where}[{k}].count must be an integer >= 1, got {count!r}"
            if where == "include" and "color" in req and req["color"] not in REFERENCE_COLORS:
                return f"include[{k}].color {req['color']!r} is not one of GenEval's colours {list(REFERENCE_COLORS)}"
            if where == "include" and "position" in req:
                pos = req["position"]
                if not (isinstance(pos, list) and len(pos) == 2 and pos[0] in RELATIONS and isinstance(pos[1], int)
                        and not isinstance(pos[1], bool) and 0 <= pos[1] < k):
                    return f"include[{k}].position must be [one of {list(RELATIONS)}, an earlier index], got {pos!r}"
    return None


def evaluate(image, detections: list[Detection], meta: dict, *, threshold: float = 0.3,
             counting_threshold: float = 0.9, max_objects: int = 16, nms_iou: float = 0.5,
             position_threshold: float = 0.1, colors: ColorClassifier | None = None) -> tuple[int, int, list[str]]:
    """(requirements passed, requirements checked, reasons for failures) for one image (rules: module docstring)."""
    include, exclude = meta.get("include"), meta.get("exclude", [])
    if not isinstance(include, list) or not include:
        raise ValueError("metadata has no GenEval 'include' list")
    cut = counting_threshold if meta.get("tag") == "counting" else threshold
    by_class = select_detections(detections, cut, max_objects, nms_iou)
    colors = colors or MeanColorClassifier()
    passed, checked, failures = 0, 0, []
    groups: list[list[Detection] | None] = []  # the objects of each include entry that matched, else None

    def check(ok: bool, reason: str) -> bool:
        nonlocal passed, checked
        checked += 1
        passed += int(ok)
        if not ok:
            failures.append(reason)
        return ok

    for req in include:
        cls, need = req["class"], int(req.get("count", 1))
        found = by_class.get(cls, [])[:need]
        matched = check(len(found) >= need, f"expected >= {need} {cls}, found {len(found)}")
        if "color" in req:
            named = [colors.classify(image, d.box, list(REFERENCE_COLORS), cls) for d in found] if matched else []
            matched = check(matched and named.count(req["color"]) >= need,
                            f"expected {req['color']} {cls}, found {named}")
        if "position" in req:
            relation, j = req["position"][0], int(req["position"][1])
            if relation not in RELATIONS:
                raise ValueError(f"unknown relation {relation!r}; expected one of {RELATIONS}")
            if not 0 <= j < len(groups):
                raise ValueError(f"position {req['position']!r} of {cls!r} names include[{j}], which is not an "
                                 f"earlier entry of 'include'")
            target = groups[j]
            ok = matched and target is not None and all(relation in relations(a, b, position_threshold)
                                                        for a in found for b in target)
            matched = check(ok, f"expected {cls} {relation} {include[j]['class']}")
        groups.append(found if matched else None)
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
    weight_paths = (WeightPath("detector_path", (ENV_VAR,)),
                    WeightPath("color_model_name_or_path", (COLOR_ENV_VAR,), required=False))

    def __init__(self, detector_path: str | None = None, *, detector: Detector | None = None,
                 device: str | None = None, threshold: float = 0.3, counting_threshold: float = 0.9,
                 max_objects: int = 16, nms_iou: float = 0.5, position_threshold: float = 0.1, partial: bool = False,
                 colors: ColorClassifier | None = None, color_model_name_or_path: str | None = None,
                 parse_prompts: bool = True):
        self.parse_prompts = parse_prompts
        if detector is None:
            path = detector_path or os.environ.get(ENV_VAR)
            if not path:
                raise ValueError(f"geneval: no detector given; set ${ENV_VAR} or pass detector_path (an OWLv2 model)")
            detector = Owlv2Detector(path, device)
        if colors is None and (color_model_name_or_path or os.environ.get(COLOR_ENV_VAR)):
            colors = ClipColorClassifier(color_model_name_or_path, device)
        self.detector, self.partial, self.colors = detector, partial, colors or MeanColorClassifier()
        self.options = dict(threshold=threshold, counting_threshold=counting_threshold, max_objects=max_objects,
                            nms_iou=nms_iou, position_threshold=position_threshold)

    def requirements(self, prompt: str, meta: dict) -> dict | None:
        """The GenEval metadata to check: ``meta`` when it has an ``include`` list, else the prompt's template."""
        include = meta.get("include")
        if isinstance(include, list) and include:
            return meta
        return parse_geneval_prompt(prompt) if self.parse_prompts else None

    def wants(self, prompt, meta):
        return self.requirements(prompt, meta) is not None

    def score(self, images, prompts, metadata):
        n = len(images)
        scores, valid = torch.zeros(n), torch.zeros(n, dtype=torch.bool)
        info = {"image_errors": [None] * n, "failures": [[] for _ in range(n)], "num_skipped_no_metadata": 0,
                "num_bad_metadata": 0}
        for i, (image, prompt, meta) in enumerate(zip(images, prompts, metadata)):
            meta = self.requirements(prompt, meta)
            if meta is None:  # nothing to score: no error (as OCR without quoted text)
                info["num_skipped_no_metadata"] += 1
                continue
            problem = metadata_problem(meta)
            if problem is not None:  # a malformed record fails its own image only
                info["num_bad_metadata"] += 1
                info["image_errors"][i] = f"geneval: malformed GenEval metadata: {problem}"
                continue
            classes = [r["class"] for r in meta["include"]] + [r["class"] for r in meta.get("exclude", [])]
            detections = self.detector.detect(image, classes)
            passed, checked, failures = evaluate(image, detections, meta, colors=self.colors, **self.options)
            info["failures"][i] = failures
            scores[i] = passed / checked if self.partial else float(passed == checked)
            valid[i] = True
        return scores, valid, info
