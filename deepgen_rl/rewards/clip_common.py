"""Loading and embedding helpers shared by the CLIP-based rewards (pickscore, aesthetic, hpsv2).

Every model loads with ``from_pretrained`` from a local directory or hub id given by a kwarg or an env var; the
error names both. Embeddings are the projected features, L2-normalised, fp32: FloatTensor[N, D].
"""
from __future__ import annotations

import os

import torch


def resolve_path(reward: str, path: str | None, env_var: str, kwarg: str = "model_name_or_path") -> str:
    path = path or os.environ.get(env_var)
    if not path:
        raise ValueError(f"{reward}: no model given; set ${env_var} or pass {kwarg} in --reward_kwargs")
    return path


def load_clip(reward: str, path: str, env_var: str, dtype: torch.dtype = torch.float32):
    """CLIPModel from ``path`` in eval mode without grads; OSError naming ``env_var`` on failure."""
    from transformers import CLIPModel

    try:
        return CLIPModel.from_pretrained(path, dtype=dtype).eval().requires_grad_(False)
    except (OSError, ValueError) as exc:
        raise OSError(f"{reward}: cannot load a CLIPModel from {path!r} (${env_var}): {exc}") from exc


def load_processor(reward: str, path: str, env_var: str):
    """(tokenizer, image processor) from ``path``; OSError naming ``env_var`` on failure."""
    from transformers import AutoImageProcessor, AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path), AutoImageProcessor.from_pretrained(path)
    except (OSError, ValueError) as exc:
        raise OSError(f"{reward}: cannot load a tokenizer + image processor from {path!r} (${env_var}): {exc}") \
            from exc


def _features(output) -> torch.Tensor:
    # transformers 5 returns a ModelOutput whose pooler_output holds the projected features; 4.x a tensor.
    return output if isinstance(output, torch.Tensor) else output.pooler_output


def image_embeddings(model, image_processor, images, device) -> torch.Tensor:
    """L2-normalised projected image features, FloatTensor[N, D] fp32."""
    pixels = image_processor(images=[img.convert("RGB") for img in images], return_tensors="pt")["pixel_values"]
    emb = _features(model.get_image_features(pixel_values=pixels.to(device, model.dtype))).float()
    return torch.nn.functional.normalize(emb, dim=-1)


def text_embeddings(model, tokenizer, prompts, device) -> torch.Tensor:
    """L2-normalised projected text features, FloatTensor[N, D] fp32 (prompts truncated to the model's context)."""
    max_length = int(model.config.text_config.max_position_embeddings)
    batch = tokenizer(list(prompts), padding="max_length", truncation=True, max_length=max_length,
                      return_tensors="pt")
    emb = _features(model.get_text_features(input_ids=batch["input_ids"].to(device),
                                            attention_mask=batch["attention_mask"].to(device))).float()
    return torch.nn.functional.normalize(emb, dim=-1)
