"""``toy_compositional``: fraction of a toy-world prompt's claims that the image satisfies (deepgen_rl.toy).

score = (number of passing claims) / (number of claims), in [0, 1], claims read by `deepgen_rl.toy.checker.check`
(each object's colour, shape and count, and the stated position). A prompt that is not a caption of the toy grammar
cannot be scored: ``valid=False`` (counted in ``info["num_not_toy_caption"]``), never a made-up number.

``exclusive=True`` (``--reward_kwargs '{"toy_compositional": {"exclusive": true}}'``) adds one claim: no blob of a
colour the prompt does not name. It makes the reward's colour claims prompt-specific: without it an image of every
colour passes every prompt's colour claims (docs/toy_world.md, "Prompt-specific or prompt-blind?").

``blind=True`` is a control, not a training signal: each image is scored against a random caption of the toy grammar (a
kind — single, count, region, relation — uniformly, then one of its ``world.all_specs()`` uniformly), chosen by a hash
of the image's pixels (deterministic, whatever the batching). Its expected value given an image does not depend on the
image's prompt, so RL on it can only make prompt-blind changes; what RL on the real reward gains beyond a blind run is
prompt following (tests/toy/test_toy_rl.py). The prompt must still be a toy caption (else ``valid=False``, as always).

``soft_color=True`` (a training-reward option; evaluation keeps the binary claims) scores each colour claim by
``max(passed, hue_closeness)`` (`deepgen_rl.toy.checker.hue_closeness`: 1 within the checker's 28° of the colour's
hue, falling linearly to 0 at the opposite hue) instead of 0/1, the other claims as before. A prompt whose images all
miss a colour (a held-out "red triangle" drawn orange or magenta) then still ranks them by how near in hue they come,
where the binary reward gives the whole group one score and a zero advantage. The score stays in [0, 1] and equals
the binary one whenever every colour claim passes or the image has no vivid region.

``soft_shape=True`` and ``soft_position=True`` do the same for the shape and position claims (training options too):
a failing shape claim scores how near the colour's blobs come to being read as the shape
(`deepgen_rl.toy.checker.shape_closeness`: distance of the blob's centroid height, fill and corner fill from the
checker's thresholds), a failing position claim how near the stated side the objects come
(`deepgen_rl.toy.checker.position_closeness`: 1 + margin / 32 px, floored at 0). A claim that passes scores 1 under
every option, so a correct image scores 1 and every image's score stays in [0, 1]. The options combine freely.
"""
from __future__ import annotations

import hashlib

import numpy as np
import torch

from .base import Reward, register_reward


@register_reward("toy_compositional")
class ToyCompositionalReward(Reward):
    name = "toy_compositional"

    def __init__(self, exclusive: bool = False, blind: bool = False, soft_color: bool = False,
                 soft_shape: bool = False, soft_position: bool = False):
        for name, value in (("exclusive", exclusive), ("blind", blind), ("soft_color", soft_color),
                            ("soft_shape", soft_shape), ("soft_position", soft_position)):
            if not isinstance(value, bool):
                raise ValueError(f"toy_compositional: {name} must be true or false, got {value!r}")
        self.exclusive = exclusive
        self.blind = blind
        self.soft_color = soft_color
        self.soft_shape = soft_shape
        self.soft_position = soft_position

    def score(self, images, prompts, metadata):
        from deepgen_rl.toy.checker import (blobs_with_masks, check_blobs, hue_and_vivid, hue_closeness,
                                            position_closeness, shape_closeness)
        from deepgen_rl.toy.world import KINDS, CaptionError, parse_caption, specs_by_kind

        pools = [specs_by_kind()[k] for k in KINDS] if self.blind else []  # cached per kind
        scores, valid, not_toy, strict = [], [], 0, 0
        for img, prompt in zip(images, prompts):
            try:
                spec = parse_caption(prompt)
            except CaptionError:
                scores.append(0.0)
                valid.append(False)
                not_toy += 1
                continue
            if self.blind:
                digest = hashlib.sha256(np.asarray(img.convert("RGB")).tobytes()).digest()
                pool = pools[digest[0] % len(pools)]
                spec = pool[int.from_bytes(digest[1:9], "big") % len(pool)]
            hv = hue_and_vivid(img)  # read once: the blobs and the colour closeness both use it
            found = blobs_with_masks(img, hue_vivid=hv)
            blobs = [b for b, _ in found]
            result = check_blobs(blobs, spec, exclusive=self.exclusive)
            if self.soft_color or self.soft_shape or self.soft_position:
                dense = {}  # claim type -> value of its claims that fail (a passing claim keeps 1)
                if self.soft_color:
                    near = hue_closeness(img, [o.color for o in spec.objects], hue_vivid=hv)
                    dense["color"] = lambda c: near[c.text]  # text: the colour
                if self.soft_shape:
                    shapes = shape_closeness(found, spec.objects)
                    dense["shape"] = lambda c: shapes[tuple(c.text.split())]  # text: "<colour> <shape>"
                if self.soft_position:
                    pos = position_closeness(blobs, spec)
                    dense["position"] = lambda c: pos
                total = 0.0
                for c in result.claims:
                    f = dense.get(c.type)
                    total += 1.0 if c.passed else (f(c) if f is not None else 0.0)
                scores.append(total / len(result.claims))
            else:
                scores.append(result.score)
            valid.append(True)
            strict += result.strict
        info = {"num_not_toy_caption": not_toy, "strict_acc": strict / max(1, len(images) - not_toy)}
        return torch.tensor(scores, dtype=torch.float32), torch.tensor(valid, dtype=torch.bool), info
