"""Assemble a `DeepGen` from resolved model paths (every part via ``from_pretrained``) and check those paths.

Used by `build.build_model` (config resolution + checkpoints) and by `tiny` (writing the tiny model's SFT
checkpoint); neither imports the other through here, so there is no import circle.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Mapping, Sequence

import torch

from .deepgen.connector import ConnectorConfig
from .deepgen.lora import apply_vlm_lora
from .deepgen.model import DEFAULT_MAX_PROMPT_TOKENS, PROMPT_TEMPLATE, DeepGen

logger = logging.getLogger(__name__)

LMM_EXPECTED = "a folder with config.json, model weights and tokenizer files (Qwen2.5-VL-3B-Instruct, transformers layout)"
SD3_EXPECTED = ("a folder with transformer/, vae/, scheduler/ (diffusers layout of UniPic2-SD3.5M-Kontext-2B)")
SD3_SUBFOLDERS = ("transformer", "vae", "scheduler")
_DTYPES = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16,
           "float32": torch.float32, "fp32": torch.float32}


class ModelPathError(ValueError):
    """A model path is unset, missing, or does not hold what the model needs."""


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return _DTYPES[str(dtype)]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(_DTYPES)}") from None


def check_model_dir(path: str | None, env: str | None, expected: str, subfolders: Sequence[str] = ()) -> str:
    """Return ``path`` if it is a non-empty folder holding ``subfolders``; else raise `ModelPathError`."""
    name = env or "model path"
    if not path:
        raise ModelPathError(f"{name} is not set: expected {expected}")
    problem = None
    if not os.path.isdir(path):
        problem = "does not exist" if not os.path.exists(path) else "is not a folder"
    elif not os.listdir(path):
        problem = "is empty"
    else:
        absent = [s for s in subfolders if not os.path.isdir(os.path.join(path, s))]
        if absent:
            problem = f"lacks {', '.join(s + '/' for s in absent)}"
    if problem:
        raise ModelPathError(f"{name}={path} {problem}: expected {expected}")
    return path


def check_model_paths(cfg: Mapping[str, Any]) -> tuple[str, str]:
    """(lmm_path, sd3_path) of a resolved config after checking both folders; raises `ModelPathError`."""
    lmm_path = check_model_dir(cfg.get("lmm_path"), cfg.get("lmm_path_env"), LMM_EXPECTED)
    if not os.path.isfile(os.path.join(lmm_path, "config.json")):
        raise ModelPathError(f"{cfg.get('lmm_path_env') or 'lmm_path'}={lmm_path} has no config.json: "
                             f"expected {LMM_EXPECTED}")
    sd3_path = check_model_dir(cfg.get("sd3_path"), cfg.get("sd3_path_env"), SD3_EXPECTED, SD3_SUBFOLDERS)
    return lmm_path, sd3_path


def build_from_config(cfg: Mapping[str, Any]) -> DeepGen:
    """Build a `DeepGen` from a resolved config dict (no checkpoint): every part via ``from_pretrained``."""
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel
    from transformers import AutoTokenizer, Qwen2_5_VLForConditionalGeneration

    lmm_path, sd3_path = check_model_paths(cfg)
    dtype = resolve_dtype(cfg.get("dtype", "bfloat16"))
    vae_dtype = resolve_dtype(cfg.get("vae_dtype") or dtype)

    lmm = Qwen2_5_VLForConditionalGeneration.from_pretrained(lmm_path, attn_implementation="sdpa", dtype=dtype)
    if cfg.get("lora_rank"):
        apply_vlm_lora(lmm, rank=int(cfg["lora_rank"]), alpha=float(cfg.get("lora_alpha", cfg["lora_rank"])))
    lmm.requires_grad_(False)
    tokenizer = AutoTokenizer.from_pretrained(lmm_path)
    transformer = SD3Transformer2DModel.from_pretrained(sd3_path, subfolder="transformer", torch_dtype=dtype)
    vae = AutoencoderKL.from_pretrained(sd3_path, subfolder="vae", torch_dtype=vae_dtype)
    scheduler = FlowMatchEulerDiscreteScheduler.from_pretrained(sd3_path, subfolder="scheduler")

    # Fresh connector / projector_1 / think tokens are deterministic (they are overwritten by any SFT checkpoint).
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(cfg.get("init_seed", 0)))
        model = DeepGen(
            lmm=lmm, tokenizer=tokenizer, transformer=transformer, vae=vae, scheduler=scheduler,
            connector_config=ConnectorConfig(**cfg.get("connector", {})),
            num_queries=int(cfg.get("num_queries", 128)),
            max_prompt_tokens=int(cfg.get("max_prompt_tokens", DEFAULT_MAX_PROMPT_TOKENS)),
            prompt_template=cfg.get("prompt_template", PROMPT_TEMPLATE),
        )
    for module in (model.connector, model.projector_1, model.projector_2, model.projector_3):
        module.to(dtype)
    model.meta_queries.data = model.meta_queries.data.to(dtype)
    return model
