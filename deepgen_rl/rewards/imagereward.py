"""``imagereward``: ImageReward (Xu et al. 2023): BLIP (ViT-L/16 image encoder + BERT-base text encoder with
cross-attention to the image) and an MLP head, trained on human preference rankings.

Loaded with our own code on transformers' BLIP classes (``BlipVisionModel``, ``BlipTextModel``); the ``image-reward``
package is not needed. Weights: ``$IMAGEREWARD_MODEL_PATH`` (``model_path``) = the published ``ImageReward.pt`` (a state
dict with ``blip.visual_encoder.*``, ``blip.text_encoder.*``, ``mlp.layers.*``; read with ``weights_only=True``).
Tokenizer: ``$IMAGEREWARD_TOKENIZER_PATH`` (``tokenizer_path``; published: ``bert-base-uncased``).

Key map (original BLIP → transformers): ``visual_encoder.cls_token/pos_embed/patch_embed.proj`` →
``embeddings.class_embedding/position_embedding/patch_embedding``; ``blocks.i.norm1/norm2/attn.qkv/attn.proj/mlp.fc1/
mlp.fc2`` → ``encoder.layers.i.layer_norm1/layer_norm2/self_attn.qkv/self_attn.projection/mlp.fc1/mlp.fc2``; ``norm``
→ ``post_layernorm``; the text encoder's BERT names are identical. The ITC/ITM heads (``vision_proj``,
``text_proj``, ``itm_head``) are unused and skipped. BLIP's ViT uses LayerNorm eps 1e-6, its BERT 1e-12.

Forward (as published): image → 224 px (bicubic resize of the short side, centre crop, CLIP mean/std) → ViT tokens
V; prompt → BERT ids (max 35 tokens, padded) → text encoder with cross-attention to V; h = hidden state of the first
([CLS]) token; r = MLP(h) (the LAION-style 5-Linear head, no activations).

score = (r − 0.16717362830052426) / 1.0333394966054072 (the published normalisation, mean 0 / std 1 over its
training prompts); unbounded, about −2..2 on real images. Batch-size invariant (each row is independent).
"""
from __future__ import annotations

import math
import os
import re
import threading

import torch
from torch import nn

from .aesthetic import AestheticMLP
from .base import Reward, WeightPath, register_reward
from .clip_common import resolve_path

ENV_VAR = "IMAGEREWARD_MODEL_PATH"
TOKENIZER_ENV_VAR = "IMAGEREWARD_TOKENIZER_PATH"
REWARD_MEAN, REWARD_STD = 0.16717362830052426, 1.0333394966054072
CLIP_MEAN, CLIP_STD = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)
MAX_TEXT_TOKENS = 35

_VIT_BLOCK = re.compile(r"^blocks\.(\d+)\.(norm1|norm2|attn\.qkv|attn\.proj|mlp\.fc1|mlp\.fc2)\.(weight|bias)$")
_VIT_RENAMES = {"norm1": "layer_norm1", "norm2": "layer_norm2", "attn.qkv": "self_attn.qkv",
                "attn.proj": "self_attn.projection", "mlp.fc1": "mlp.fc1", "mlp.fc2": "mlp.fc2"}
_VIT_DIRECT = {"cls_token": "embeddings.class_embedding", "pos_embed": "embeddings.position_embedding",
               "patch_embed.proj.weight": "embeddings.patch_embedding.weight",
               "patch_embed.proj.bias": "embeddings.patch_embedding.bias",
               "norm.weight": "post_layernorm.weight", "norm.bias": "post_layernorm.bias"}
_UNUSED = ("blip.vision_proj.", "blip.text_proj.", "blip.itm_head.", "blip.temp")


def split_checkpoint(state: dict[str, torch.Tensor]) -> tuple[dict, dict, dict]:
    """(vision, text, mlp) state dicts in transformers / our naming; KeyError naming any key it cannot place."""
    vision, text, mlp, unknown = {}, {}, {}, []
    for key, value in state.items():
        key = key.removeprefix("module.")
        if key.startswith("blip.visual_encoder."):
            rest = key.removeprefix("blip.visual_encoder.")
            if rest in _VIT_DIRECT:
                vision[_VIT_DIRECT[rest]] = value
            elif match := _VIT_BLOCK.match(rest):
                vision[f"encoder.layers.{match.group(1)}.{_VIT_RENAMES[match.group(2)]}.{match.group(3)}"] = value
            else:
                unknown.append(key)
        elif key.startswith("blip.text_encoder."):
            rest = key.removeprefix("blip.text_encoder.")
            if not rest.endswith("position_ids"):
                text[rest] = value
        elif key.startswith("mlp."):
            mlp[key.removeprefix("mlp.")] = value
        elif not key.startswith(_UNUSED) and key not in ("mean", "std"):
            unknown.append(key)
    if unknown:
        raise KeyError(f"ImageReward checkpoint keys with no place: {unknown[:8]} ({len(unknown)} in all)")
    return vision, text, mlp


class ImageRewardModel(nn.Module):
    """BLIP vision + text encoders and the MLP head; ``forward(pixel_values, input_ids, attention_mask)`` returns
    the normalised reward, FloatTensor[N]."""

    def __init__(self, vision_config, text_config):
        super().__init__()
        from transformers import BlipVisionModel
        from transformers.models.blip.modeling_blip_text import BlipTextModel

        self.vision = BlipVisionModel(vision_config)
        self.text = BlipTextModel(text_config, add_pooling_layer=False)
        self.mlp = AestheticMLP(text_config.hidden_size)

    def forward(self, pixel_values, input_ids, attention_mask) -> torch.Tensor:
        image_embeds = self.vision(pixel_values=pixel_values).last_hidden_state
        image_mask = torch.ones(image_embeds.shape[:-1], dtype=torch.long, device=image_embeds.device)
        hidden = self.text(input_ids=input_ids, attention_mask=attention_mask, encoder_hidden_states=image_embeds,
                           encoder_attention_mask=image_mask).last_hidden_state[:, 0, :]
        return ((self.mlp(hidden.float()) - REWARD_MEAN) / REWARD_STD).squeeze(-1)


def build_configs(vision: dict, text: dict, *, vision_heads: int, text_heads: int):
    """BlipVisionConfig / BlipTextConfig from the checkpoint's tensor shapes (head counts are not in the shapes)."""
    from transformers import BlipTextConfig, BlipVisionConfig

    width, _, patch, _ = vision["embeddings.patch_embedding.weight"].shape
    grid = math.isqrt(vision["embeddings.position_embedding"].shape[1] - 1)
    depth = 1 + max(int(k.split(".")[2]) for k in vision if k.startswith("encoder.layers."))
    text_depth = 1 + max(int(k.split(".")[2]) for k in text if k.startswith("encoder.layer."))
    vocab, hidden = text["embeddings.word_embeddings.weight"].shape
    vision_config = BlipVisionConfig(hidden_size=int(width), num_hidden_layers=depth, num_attention_heads=vision_heads,
                                     intermediate_size=int(vision["encoder.layers.0.mlp.fc1.weight"].shape[0]),
                                     patch_size=int(patch), image_size=int(patch) * grid, layer_norm_eps=1e-6,
                                     hidden_act="gelu")
    text_config = BlipTextConfig(vocab_size=int(vocab), hidden_size=int(hidden), num_hidden_layers=text_depth,
                                 num_attention_heads=text_heads,
                                 intermediate_size=int(text["encoder.layer.0.intermediate.dense.weight"].shape[0]),
                                 max_position_embeddings=int(text["embeddings.position_embeddings.weight"].shape[0]),
                                 encoder_hidden_size=int(
                                     text["encoder.layer.0.crossattention.self.key.weight"].shape[1]),
                                 layer_norm_eps=1e-12, hidden_act="gelu", bos_token_id=None, sep_token_id=None,
                                 pad_token_id=0)
    return vision_config, text_config


def load_imagereward(path: str, *, vision_heads: int = 16, text_heads: int = 12) -> ImageRewardModel:
    state = torch.load(path, map_location="cpu", weights_only=True)
    state = state.get("state_dict", state) if isinstance(state, dict) else state
    vision, text, mlp = split_checkpoint(state)
    model = ImageRewardModel(*build_configs(vision, text, vision_heads=vision_heads, text_heads=text_heads))
    for part, weights in ((model.vision, vision), (model.text, text), (model.mlp, mlp)):
        part.load_state_dict(weights, strict=True)
    return model.eval().requires_grad_(False)


@register_reward("imagereward")
class ImageRewardReward(Reward):
    name = "imagereward"
    weight_paths = (WeightPath("model_path", (ENV_VAR,), "file"), WeightPath("tokenizer_path", (TOKENIZER_ENV_VAR,)))

    def __init__(self, model_path: str | None = None, tokenizer_path: str | None = None, *,
                 device: str | None = None, batch_size: int = 16, vision_heads: int = 16, text_heads: int = 12):
        from transformers import AutoTokenizer, CLIPImageProcessor

        path = resolve_path("imagereward", model_path, ENV_VAR, kwarg="model_path")
        tok_path = resolve_path("imagereward", tokenizer_path, TOKENIZER_ENV_VAR, kwarg="tokenizer_path")
        if not os.path.isfile(path):
            raise FileNotFoundError(f"imagereward: {path!r} (${ENV_VAR}) is not a file; expected ImageReward.pt")
        try:
            self.model = load_imagereward(path, vision_heads=vision_heads, text_heads=text_heads)
        except (KeyError, RuntimeError, ValueError) as exc:
            raise ValueError(f"imagereward: {path!r} (${ENV_VAR}) is not a loadable ImageReward checkpoint: {exc}") \
                from exc
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(tok_path)
        except (OSError, ValueError) as exc:
            raise OSError(f"imagereward: cannot load a tokenizer from {tok_path!r} (${TOKENIZER_ENV_VAR}): {exc}") \
                from exc
        size = int(self.model.vision.config.image_size)
        self.image_processor = CLIPImageProcessor(size={"shortest_edge": size},
                                                  crop_size={"height": size, "width": size},
                                                  image_mean=list(CLIP_MEAN), image_std=list(CLIP_STD))
        self.device = torch.device(device or "cpu")
        self.model.to(self.device)
        self.batch_size = batch_size
        self._lock = threading.Lock()

    @torch.no_grad()
    def score(self, images, prompts, metadata):
        out = []
        with self._lock:
            for s in range(0, len(images), self.batch_size):
                text = self.tokenizer(list(prompts[s:s + self.batch_size]), padding="max_length", truncation=True,
                                      max_length=MAX_TEXT_TOKENS, return_tensors="pt")
                pixels = self.image_processor(images=[im.convert("RGB") for im in images[s:s + self.batch_size]],
                                              return_tensors="pt")["pixel_values"]
                out.append(self.model(pixels.to(self.device), text["input_ids"].to(self.device),
                                      text["attention_mask"].to(self.device)).float().cpu())
        return torch.cat(out), torch.ones(len(images), dtype=torch.bool), {}
