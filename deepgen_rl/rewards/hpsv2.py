"""``hpsv2``: Human Preference Score v2.1 (Wu et al. 2023): open_clip ViT-H-14 fine-tuned on HPD v2.

Weights: ``$HPSV2_MODEL_PATH`` (``model_path``), either the published open_clip checkpoint
(``HPS_v2.1_compressed.pt``, converted on load by :mod:`deepgen_rl.rewards.open_clip_convert`, no open_clip
needed) or a directory written by that converter (``CLIPModel.from_pretrained``). Tokenizer + image processor:
``$HPSV2_PROCESSOR_NAME_OR_PATH`` (published with ``laion/CLIP-ViT-H-14-laion2B-s32B-b79K``: OpenAI CLIP BPE, 224 px
bicubic resize + centre crop, OpenAI mean/std, as open_clip's ViT-H-14 validation transform).

score = cos(E_image(image), E_text(prompt)) (L2-normalised projected embeddings, no logit scale), as HPS v2 scores;
range [-1, 1], about 0.2-0.35 on real images. Prompts are truncated to 77 tokens. Batch-size invariant.
"""
from __future__ import annotations

import os
import threading

import torch

from .base import Reward, WeightPath, register_reward
from .clip_common import image_embeddings, load_processor, resolve_path, text_embeddings
from .open_clip_convert import load_open_clip_as_hf

ENV_VAR = "HPSV2_MODEL_PATH"
PROCESSOR_ENV_VAR = "HPSV2_PROCESSOR_NAME_OR_PATH"


@register_reward("hpsv2")
class HpsV2Reward(Reward):
    name = "hpsv2"
    weight_paths = (WeightPath("model_path", (ENV_VAR,), "path"),
                    WeightPath("processor_name_or_path", (PROCESSOR_ENV_VAR,)))

    def __init__(self, model_path: str | None = None, processor_name_or_path: str | None = None, *,
                 device: str | None = None, batch_size: int = 16, text_heads: int = 16, vision_heads: int = 16):
        from transformers import CLIPModel

        path = resolve_path("hpsv2", model_path, ENV_VAR, kwarg="model_path")
        processor_path = resolve_path("hpsv2", processor_name_or_path, PROCESSOR_ENV_VAR,
                                      kwarg="processor_name_or_path")
        self.tokenizer, self.image_processor = load_processor("hpsv2", processor_path, PROCESSOR_ENV_VAR)
        try:
            if os.path.isdir(path):
                self.model = CLIPModel.from_pretrained(path).eval().requires_grad_(False)
            else:
                self.model = load_open_clip_as_hf(path, text_heads=text_heads, vision_heads=vision_heads,
                                                  eos_token_id=self.tokenizer.eos_token_id,
                                                  bos_token_id=self.tokenizer.bos_token_id,
                                                  pad_token_id=self.tokenizer.pad_token_id or 0)
        except (OSError, ValueError, KeyError, RuntimeError) as exc:
            raise OSError(f"hpsv2: cannot load HPS v2 weights from {path!r} (${ENV_VAR}; an open_clip .pt or a "
                          f"converted CLIPModel directory): {exc}") from exc
        self.device = torch.device(device or "cpu")
        self.model.to(self.device)
        self.batch_size = batch_size
        self._lock = threading.Lock()

    @torch.no_grad()
    def score(self, images, prompts, metadata):
        out = []
        with self._lock:
            for s in range(0, len(images), self.batch_size):
                img = image_embeddings(self.model, self.image_processor, images[s:s + self.batch_size], self.device)
                txt = text_embeddings(self.model, self.tokenizer, prompts[s:s + self.batch_size], self.device)
                out.append((img * txt).sum(-1).cpu())
        return torch.cat(out).clamp(-1.0, 1.0), torch.ones(len(images), dtype=torch.bool), {}
