"""``pickscore``: PickScore (Kirstain et al. 2023), a CLIP-H fine-tuned on Pick-a-Pic human preferences.

Model: transformers ``CLIPModel`` from ``$PICKSCORE_MODEL_NAME_OR_PATH`` (the published ``yuvalkirstain/PickScore_v1``),
processor (tokenizer + image processor) from ``$PICKSCORE_PROCESSOR_NAME_OR_PATH`` (published with
``laion/CLIP-ViT-H-14-laion2B-s32B-b79K``; defaults to the model path).

score = exp(logit_scale) · cos(E_text(prompt), E_image(image)) / ``scale_divisor``, as published (image and text
embeddings L2-normalised, the model's learned logit scale, exp = 100 for PickScore_v1): range [-100, 100] /
divisor; real images score about 17-24 with divisor 1. Prompts longer than 77 tokens are truncated. Each sample is
scored independently (batch-size invariant).
"""
from __future__ import annotations

import os
import threading

import torch

from .base import Reward, WeightPath, register_reward
from .clip_common import image_embeddings, load_clip, load_processor, resolve_path, text_embeddings

ENV_VAR = "PICKSCORE_MODEL_NAME_OR_PATH"
PROCESSOR_ENV_VAR = "PICKSCORE_PROCESSOR_NAME_OR_PATH"


@register_reward("pickscore")
class PickScoreReward(Reward):
    name = "pickscore"
    weight_paths = (WeightPath("model_name_or_path", (ENV_VAR,)),
                    WeightPath("processor_name_or_path", (PROCESSOR_ENV_VAR,), required=False))

    def __init__(self, model_name_or_path: str | None = None, processor_name_or_path: str | None = None, *,
                 device: str | None = None, batch_size: int = 16, scale_divisor: float = 1.0,
                 dtype: torch.dtype = torch.float32):
        path = resolve_path("pickscore", model_name_or_path, ENV_VAR)
        processor_path = processor_name_or_path or os.environ.get(PROCESSOR_ENV_VAR) or path
        self.model = load_clip("pickscore", path, ENV_VAR, dtype)
        self.tokenizer, self.image_processor = load_processor(
            "pickscore", processor_path, PROCESSOR_ENV_VAR if processor_path != path else ENV_VAR)
        self.device = torch.device(device or "cpu")
        self.model.to(self.device)
        self.batch_size, self.scale_divisor = batch_size, float(scale_divisor)
        self._lock = threading.Lock()  # one forward at a time (fast tokenizers are not re-entrant)

    @torch.no_grad()
    def score(self, images, prompts, metadata):
        out = []
        with self._lock:
            logit_scale = self.model.logit_scale.exp().float()
            for s in range(0, len(images), self.batch_size):
                img = image_embeddings(self.model, self.image_processor, images[s:s + self.batch_size], self.device)
                txt = text_embeddings(self.model, self.tokenizer, prompts[s:s + self.batch_size], self.device)
                out.append((logit_scale * (img * txt).sum(-1)).cpu() / self.scale_divisor)
        return torch.cat(out), torch.ones(len(images), dtype=torch.bool), {}
