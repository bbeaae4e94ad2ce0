"""Sampling and checking toy-world images with a (toy) DeepGen: ODE samples from per-image seeds, then the checker.

Separate from :mod:`deepgen_rl.toy.evaluate` (pure scoring, used by the eval runner) because it runs the model and
the evaluation sampler (a higher layer, docs/architecture.md).
"""
from __future__ import annotations

from typing import Sequence

import torch

from .evaluate import ToyVerdict, check_images


@torch.no_grad()
def sample_toy_images(model, prompts: Sequence[str], seeds: Sequence[int], *, num_inference_steps: int = 10,
                      cfg_scale: float = 0.0, transformer=None, batch_size: int = 32, image_size: int = 64):
    """ODE (Euler) samples, image i from ``torch.Generator().manual_seed(seeds[i])`` noise (batch-independent)."""
    from deepgen_rl.evaluation.generate import sample_latents
    from deepgen_rl.utils.images import latents_to_pil

    shape = tuple(model.latent_shape(image_size, image_size))
    uncond = model.encode_prompts([""]) if cfg_scale > 1.0 else None
    images = []
    for i in range(0, len(prompts), batch_size):
        chunk = list(prompts[i:i + batch_size])
        noise = torch.stack([torch.randn(shape, generator=torch.Generator().manual_seed(int(s)))
                             for s in seeds[i:i + batch_size]])
        x = sample_latents(model, model.encode_prompts(chunk), noise, cfg_scale=cfg_scale,
                           num_inference_steps=num_inference_steps, inference_mode="ode", uncond=uncond,
                           transformer=transformer)
        images += latents_to_pil(model.decode_latents(x))
    return images


def evaluate_prompts(model, prompts: Sequence[str], *, seed: int = 0, duplicates: int = 1, **sample_kw
                     ) -> tuple[list, list[ToyVerdict]]:
    """Sample ``duplicates`` images per prompt (seed of image (i, d) = derive_seed("toy-eval", seed, i, d)) and
    check them; returns (images, verdicts) in prompt-major order."""
    from deepgen_rl.utils.seeding import derive_seed

    items = [(i, p, d) for i, p in enumerate(prompts) for d in range(duplicates)]
    seeds = [derive_seed("toy-eval", seed, i, d) % (2 ** 63) for i, _, d in items]
    images = sample_toy_images(model, [p for _, p, _ in items], seeds, **sample_kw)
    return images, check_images(images, [p for _, p, _ in items])
