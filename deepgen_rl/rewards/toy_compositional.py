"""``toy_compositional``: fraction of a toy-world prompt's claims that the image satisfies (deepgen_rl.toy).

score = (number of passing claims) / (number of claims), in [0, 1], claims read by `deepgen_rl.toy.checker.check`
(each object's colour, shape and count, and the stated position). A prompt that is not a caption of the toy grammar
cannot be scored: ``valid=False`` (counted in ``info["num_not_toy_caption"]``), never a made-up number.

``exclusive=True`` (``--reward_kwargs '{"toy_compositional": {"exclusive": true}}'``) adds one claim: no blob of a
colour the prompt does not name. It makes the reward's colour claims prompt-specific: without it an image of every
colour passes every prompt's colour claims (docs/toy_world.md, "Prompt-specific or prompt-blind?").
"""
from __future__ import annotations

import torch

from .base import Reward, register_reward


@register_reward("toy_compositional")
class ToyCompositionalReward(Reward):
    name = "toy_compositional"

    def __init__(self, exclusive: bool = False):
        if not isinstance(exclusive, bool):
            raise ValueError(f"toy_compositional: exclusive must be true or false, got {exclusive!r}")
        self.exclusive = exclusive

    def score(self, images, prompts, metadata):
        from deepgen_rl.toy.checker import check
        from deepgen_rl.toy.world import CaptionError, parse_caption

        scores, valid, not_toy, strict = [], [], 0, 0
        for img, prompt in zip(images, prompts):
            try:
                spec = parse_caption(prompt)
            except CaptionError:
                scores.append(0.0)
                valid.append(False)
                not_toy += 1
                continue
            result = check(img, spec, exclusive=self.exclusive)
            scores.append(result.score)
            valid.append(True)
            strict += result.strict
        info = {"num_not_toy_caption": not_toy, "strict_acc": strict / max(1, len(images) - not_toy)}
        return torch.tensor(scores, dtype=torch.float32), torch.tensor(valid, dtype=torch.bool), info
