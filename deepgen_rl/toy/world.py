"""The toy compositional world: a caption grammar, its structured specs, a seeded renderer and the splits.

Images are 64×64 RGB, a plain light-grey background with flat-coloured, axis-aligned shapes. Captions come from a
small grammar (every caption parses back to exactly one spec, see :func:`parse_caption`)::

    single    "a red circle"                           objects [(red, circle, 1)]
    count     "two blue squares" | "three …"           objects [(blue, square, 2|3)]
    region    "a green triangle on the left"           … + position {"kind": "region", "region": left|right|top|bottom}
              ("on the left", "on the right", "at the top", "at the bottom")
    relation  "a red circle left of a blue square"     objects [A, B] + position {"kind": "relation",
              (left of | right of | above | below)      "relation": …}; A and B have different colours

Every colour appears in at most one object group of a caption, so the checker can read an image colour by colour.

Splits: the colour–shape pairs in :data:`HELD_OUT_PAIRS` never occur in the train split (the pre-training data);
the held-out split is every caption that contains at least one of them (new compositions of known words).
"""

from __future__ import annotations

import functools
import itertools
import random
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from types import MappingProxyType

import numpy as np
from PIL import Image, ImageDraw

IMAGE_SIZE = 64
SIZE_RANGE = (14.0, 20.0)  # object side / diameter in px, uniform
BACKGROUND = (232, 232, 228)
# Hues far apart (red 0°, yellow 52°, green 128°, cyan 186°, blue 226°, magenta 304°) so blur and mixing with the
# neutral background keep each colour's hue.
COLORS: dict[str, tuple[int, int, int]] = {
    "red": (222, 34, 34), "yellow": (232, 200, 22), "green": (34, 168, 58), "cyan": (30, 196, 214),
    "blue": (40, 72, 226), "magenta": (208, 40, 200),
}
SHAPES = ("circle", "square", "triangle")
COUNT_WORDS = {1: "a", 2: "two", 3: "three"}
REGIONS = {"left": "on the left", "right": "on the right", "top": "at the top", "bottom": "at the bottom"}
RELATIONS = ("left of", "right of", "above", "below")
HELD_OUT_PAIRS = frozenset({("red", "triangle"), ("green", "circle"), ("blue", "square"), ("magenta", "triangle")})
KINDS = ("single", "count", "region", "relation")

_SUPERSAMPLE = 4


@dataclass(frozen=True)
class ObjectSpec:
    color: str
    shape: str
    count: int = 1


@dataclass(frozen=True)
class Spec:
    """What a caption asks for. ``position``: None, ("region", r) or ("relation", rel) where the relation reads
    ``objects[0] <rel> objects[1]``."""

    objects: tuple[ObjectSpec, ...]
    position: tuple[str, str] | None = None
    kind: str = field(default="single", compare=False)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "objects": [asdict(o) for o in self.objects],
                "position": list(self.position) if self.position else None}

    def pairs(self) -> set[tuple[str, str]]:
        return {(o.color, o.shape) for o in self.objects}

    @property
    def held_out(self) -> bool:
        return bool(self.pairs() & HELD_OUT_PAIRS)


def _noun(obj: ObjectSpec) -> str:
    plural = "s" if obj.count > 1 else ""
    return f"{COUNT_WORDS[obj.count]} {obj.color} {obj.shape}{plural}"


def caption(spec: Spec) -> str:
    """The grammar's caption of ``spec`` (inverse of :func:`parse_caption`)."""
    if spec.position is None:
        return _noun(spec.objects[0])
    kind, value = spec.position
    if kind == "region":
        return f"{_noun(spec.objects[0])} {REGIONS[value]}"
    return f"{_noun(spec.objects[0])} {value} {_noun(spec.objects[1])}"


_COLOR = "|".join(COLORS)
_SHAPE = "|".join(SHAPES)
_NOUN = rf"(a|two|three) ({_COLOR}) ({_SHAPE})(s?)"
_REGION_TEXT = {v: k for k, v in REGIONS.items()}
_RE_NOUN = re.compile(rf"^{_NOUN}$")
_RE_REGION = re.compile(rf"^{_NOUN} ({'|'.join(REGIONS.values())})$")
_RE_RELATION = re.compile(rf"^{_NOUN} ({'|'.join(RELATIONS)}) {_NOUN}$")
_WORD_COUNTS = {w: n for n, w in COUNT_WORDS.items()}


class CaptionError(ValueError):
    """A prompt that is not a caption of the toy grammar."""


def _obj(count_word: str, color: str, shape: str, plural: str, text: str) -> ObjectSpec:
    count = _WORD_COUNTS[count_word]
    if (count > 1) != bool(plural):
        raise CaptionError(f"toy caption {text!r}: '{count_word}' needs {'a plural' if count > 1 else 'a singular'} "
                           f"shape")
    return ObjectSpec(color, shape, count)


def parse_caption(text: str) -> Spec:
    """Spec of a toy-grammar caption (case and surrounding space ignored); raises `CaptionError` otherwise."""
    t = " ".join(text.strip().lower().rstrip(".").split())
    if m := _RE_NOUN.match(t):
        obj = _obj(*m.groups(), text)
        return Spec((obj,), None, kind="count" if obj.count > 1 else "single")
    if m := _RE_REGION.match(t):
        obj = _obj(*m.groups()[:4], text)
        if obj.count != 1:
            raise CaptionError(f"toy caption {text!r}: positions are only stated for single objects")
        return Spec((obj,), ("region", _REGION_TEXT[m.group(5)]), kind="region")
    if m := _RE_RELATION.match(t):
        g = m.groups()
        a, b = _obj(*g[:4], text), _obj(*g[5:9], text)
        if a.count != 1 or b.count != 1:
            raise CaptionError(f"toy caption {text!r}: relations are only stated between single objects")
        if a.color == b.color:
            raise CaptionError(f"toy caption {text!r}: the two objects of a relation must differ in colour")
        return Spec((a, b), ("relation", g[4]), kind="relation")
    raise CaptionError(f"{text!r} is not a toy-world caption (expected e.g. 'a red circle', 'two blue squares', "
                       f"'a green triangle on the left', 'a red circle left of a blue square')")


def all_specs() -> list[Spec]:
    """Every spec of the grammar, in a fixed order (18 single, 36 count, 72 region, 1080 relation)."""
    pairs = list(itertools.product(COLORS, SHAPES))
    specs = [Spec((ObjectSpec(c, s),), None, "single") for c, s in pairs]
    specs += [Spec((ObjectSpec(c, s, n),), None, "count") for n in (2, 3) for c, s in pairs]
    specs += [Spec((ObjectSpec(c, s),), ("region", r), "region") for r in REGIONS for c, s in pairs]
    specs += [Spec((ObjectSpec(c1, s1), ObjectSpec(c2, s2)), ("relation", rel), "relation")
              for rel in RELATIONS for (c1, s1), (c2, s2) in itertools.product(pairs, pairs) if c1 != c2]
    return specs


def split_specs(split: str) -> list[Spec]:
    """``train`` (no held-out colour–shape pair) or ``held_out`` (at least one)."""
    if split not in ("train", "held_out"):
        raise ValueError(f"split must be 'train' or 'held_out', got {split!r}")
    return [s for s in all_specs() if s.held_out == (split == "held_out")]


@functools.lru_cache(maxsize=None)
def specs_by_kind(split: str | None = None) -> Mapping[str, tuple[Spec, ...]]:
    """Kind -> the specs of that kind, in :func:`all_specs` order: of the whole grammar (``split=None``) or of one
    split (:func:`split_specs`). Built once per split; read-only."""
    specs = all_specs() if split is None else split_specs(split)
    return MappingProxyType({k: tuple(s for s in specs if s.kind == k) for k in KINDS})


def sample_specs(split: str, n: int, seed: int, kind_weights: dict[str, float] | None = None) -> list[Spec]:
    """``n`` distinct specs of ``split``, kinds mixed by ``kind_weights`` (default equal), fixed by ``seed``."""
    weights = kind_weights or {k: 1.0 for k in KINDS}
    rng = random.Random(seed)
    pool = {k: list(specs) for k, specs in specs_by_kind(split).items()}
    for k in pool:
        rng.shuffle(pool[k])
    kinds = [k for k in KINDS if weights.get(k, 0) > 0 and pool[k]]
    out: list[Spec] = []
    while len(out) < n and any(pool[k] for k in kinds):
        k = rng.choices(kinds, [weights[k] for k in kinds])[0]
        if pool[k]:
            out.append(pool[k].pop())
    if len(out) < n:
        raise ValueError(f"split {split!r} has only {len(out)} specs of kinds {kinds}, asked for {n}")
    return out


# ---------------------------------------------------------------------------------------------------- rendering
@dataclass(frozen=True)
class Placed:
    color: str
    shape: str
    cx: float
    cy: float
    size: float


def _box_ok(p: Placed, others: list[Placed], gap: float = 3.0) -> bool:
    half = p.size / 2
    if p.cx - half < 1 or p.cy - half < 1 or p.cx + half > IMAGE_SIZE - 1 or p.cy + half > IMAGE_SIZE - 1:
        return False
    return all(abs(p.cx - q.cx) >= (p.size + q.size) / 2 + gap or abs(p.cy - q.cy) >= (p.size + q.size) / 2 + gap
               for q in others)


def layout(spec: Spec, rng: random.Random, sizes: tuple[float, float] = SIZE_RANGE) -> list[Placed]:
    """Random non-overlapping placement satisfying the spec's position (object sizes uniform in ``sizes``)."""
    half = IMAGE_SIZE / 2
    for _ in range(1000):
        placed: list[Placed] = []
        ok = True
        for obj in spec.objects:
            for _ in range(obj.count):
                for _ in range(200):
                    size = rng.uniform(*sizes)
                    lo, hi = size / 2 + 1, IMAGE_SIZE - size / 2 - 1
                    cx, cy = rng.uniform(lo, hi), rng.uniform(lo, hi)
                    if spec.position and spec.position[0] == "region":
                        r = spec.position[1]
                        if (r == "left" and cx > half - 6) or (r == "right" and cx < half + 6) or \
                           (r == "top" and cy > half - 6) or (r == "bottom" and cy < half + 6):
                            continue
                    p = Placed(obj.color, obj.shape, cx, cy, size)
                    if _box_ok(p, placed):
                        placed.append(p)
                        break
                else:
                    ok = False
        if ok and spec.position and spec.position[0] == "relation":
            a, b = placed
            ok = _relation_margin(spec.position[1], a.cx, a.cy, b.cx, b.cy) >= 12
        if ok:
            return placed
    raise RuntimeError(f"could not lay out {caption(spec)!r}")


# Fixed object centres (px) of :func:`slot_layout`, by what the spec asks for, on a grid of 16 / 32 / 48: with objects
# up to 26 px and centres moved up to 2 px, every object stays ≥ 1 px inside the image and ≥ 2 px from the others.
# Three objects sit in a triangle (a row of three does not fit).
_SLOTS = {
    1: [(32.0, 32.0)], 2: [(16.0, 32.0), (48.0, 32.0)], 3: [(16.0, 16.0), (48.0, 16.0), (32.0, 48.0)],
    "left": [(16.0, 32.0)], "right": [(48.0, 32.0)], "top": [(32.0, 16.0)], "bottom": [(32.0, 48.0)],
    "left of": [(16.0, 32.0), (48.0, 32.0)], "right of": [(48.0, 32.0), (16.0, 32.0)],
    "above": [(32.0, 16.0), (32.0, 48.0)], "below": [(32.0, 48.0), (32.0, 16.0)],
}
LAYOUTS = ("random", "slots")


def slot_layout(spec: Spec, rng: random.Random, sizes: tuple[float, float] = (22.0, 26.0),
                jitter: float = 2.0) -> list[Placed]:
    """Placement at fixed slots that depend only on what the spec asks for (its count, region or relation), each
    centre moved by at most ``jitter`` px and each size uniform in ``sizes`` (at most 26 px: the slots keep ≥ 2 px
    gaps up to that size). Every placement satisfies the spec; a pre-training option of the toy model (a caption
    then has nearly one image, which a small DiT learns far faster than :func:`layout`'s random placements)."""
    if not 0 < sizes[0] <= sizes[1] <= 26.0 or not 0 <= jitter <= 2.0:
        raise ValueError(f"slot_layout: sizes {sizes!r} must lie in (0, 26] and jitter {jitter!r} in [0, 2]")
    if spec.position is None:
        slots = _SLOTS[spec.objects[0].count]
    else:
        slots = _SLOTS[spec.position[1]]
    items = [(o.color, o.shape) for o in spec.objects for _ in range(o.count)]
    return [Placed(color, shape, cx + rng.uniform(-jitter, jitter), cy + rng.uniform(-jitter, jitter),
                   rng.uniform(*sizes)) for (color, shape), (cx, cy) in zip(items, slots, strict=True)]


def _relation_margin(rel: str, ax: float, ay: float, bx: float, by: float) -> float:
    """How far (px) A is on the stated side of B; > 0 means the relation holds."""
    return {"left of": bx - ax, "right of": ax - bx, "above": by - ay, "below": ay - by}[rel]


def _draw(draw: ImageDraw.ImageDraw, p: Placed, k: int) -> None:
    x0, y0 = (p.cx - p.size / 2) * k, (p.cy - p.size / 2) * k
    x1, y1 = (p.cx + p.size / 2) * k, (p.cy + p.size / 2) * k
    fill = COLORS[p.color]
    if p.shape == "circle":
        draw.ellipse([x0, y0, x1, y1], fill=fill)
    elif p.shape == "square":
        draw.rectangle([x0, y0, x1, y1], fill=fill)
    else:  # apex up, base at the bottom
        draw.polygon([((x0 + x1) / 2, y0), (x1, y1), (x0, y1)], fill=fill)


def render(placed: list[Placed]) -> Image.Image:
    """64×64 RGB image of the placed shapes (drawn at 4× and downsampled, so edges are anti-aliased)."""
    k = _SUPERSAMPLE
    img = Image.new("RGB", (IMAGE_SIZE * k, IMAGE_SIZE * k), BACKGROUND)
    draw = ImageDraw.Draw(img)
    for p in placed:
        _draw(draw, p, k)
    return img.resize((IMAGE_SIZE, IMAGE_SIZE), Image.BOX)


def render_spec(spec: Spec, seed: int) -> Image.Image:
    """A random image of ``spec``; the same (spec, seed) gives the same pixels."""
    return render(layout(spec, random.Random(f"{caption(spec)}|{seed}")))


def sample_pairs(split: str, n: int, rng: random.Random, sizes: tuple[float, float] = SIZE_RANGE,
                 layout_mode: str = "random", jitter: float = 2.0) -> list[tuple[str, Image.Image]]:
    """``n`` random (caption, image) pre-training pairs of ``split`` (kinds equally likely, object sizes in
    ``sizes``), placed by :func:`layout` (``layout_mode="random"``) or :func:`slot_layout` (``"slots"``, centres
    moved by at most ``jitter`` px)."""
    if layout_mode not in LAYOUTS:
        raise ValueError(f"layout_mode {layout_mode!r} is not one of {LAYOUTS}")
    pools = specs_by_kind(split)
    out = []
    for _ in range(n):
        spec = rng.choice(pools[rng.choice(KINDS)])
        placed = layout(spec, rng, sizes) if layout_mode == "random" else slot_layout(spec, rng, sizes, jitter)
        out.append((caption(spec), render(placed)))
    return out


def images_to_array(images: list[Image.Image]) -> np.ndarray:
    """uint8 [N, 64, 64, 3]."""
    return np.stack([np.asarray(im.convert("RGB"), dtype=np.uint8) for im in images])
