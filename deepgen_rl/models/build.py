"""`build_model`: mmengine model config (+ checkpoint) -> `DeepGen`.

A model config is a plain mmengine ``.py`` file of top-level values (see ``configs/models/``):

    lmm_path, lmm_path_env        Qwen2.5-VL folder (transformers layout) and the env var it came from
    sd3_path, sd3_path_env        diffusers folder with transformer/, vae/, scheduler/
    tiny_preset                   optional: materialise `tiny.tiny_dir(preset)`, substitute "{tiny_dir}" in paths and
                                  take the preset's DeepGen sizes (tiny.PRESETS[preset]["deepgen"])
    toy_model                     optional: True = materialise the toy-world model (`deepgen_rl.toy.model`) and
                                  substitute "{toy_dir}" in paths
    default_checkpoint            optional checkpoint loaded before the ``checkpoint`` argument
    dtype, vae_dtype              "bfloat16" | "float16" | "float32" (vae_dtype defaults to dtype)
    num_queries, max_prompt_tokens, prompt_template, connector (dict of ConnectorConfig fields),
    lora_rank, lora_alpha         VLM LoRA (lora_rank 0/None = no LoRA), init_seed (fresh connector/think tokens)
"""

from __future__ import annotations

import logging
import os
from typing import Any, Mapping, Sequence

import torch

from .deepgen.checkpoint import LoadReport, load_checkpoint
from .deepgen.connector import ConnectorConfig
from .deepgen.lora import apply_vlm_lora
from .deepgen.model import PROMPT_TEMPLATE, DeepGen

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


def _config_dict(model_config: str | Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(model_config, Mapping):
        cfg = dict(model_config)
    else:
        from mmengine.config import Config

        # lazy_import=False: the real config imports `os` to read its two env vars; mmengine would otherwise treat
        # the import as a lazy (new-style) config and refuse to call os.environ.get at parse time.
        cfg = Config.fromfile(model_config, lazy_import=False).to_dict()
    unknown = sorted(set(overrides) - set(cfg))
    if unknown:
        raise KeyError(f"override(s) {unknown} are not keys of the model config {model_config}")
    cfg.update(overrides)
    if cfg.get("tiny_preset"):
        from .tiny import PRESETS, ensure_tiny_deepgen

        preset = cfg["tiny_preset"]
        if preset not in PRESETS:
            raise KeyError(f"unknown tiny_preset {preset!r}; known: {sorted(PRESETS)}")
        # The preset's DeepGen sizes must match its files; explicit overrides still win.
        cfg.update({k: v for k, v in PRESETS[preset]["deepgen"].items() if k not in overrides})
        root = ensure_tiny_deepgen(preset=preset)["root"]
        for key in ("lmm_path", "sd3_path", "default_checkpoint"):
            if isinstance(cfg.get(key), str):
                cfg[key] = cfg[key].format(tiny_dir=root)
    if cfg.get("toy_model"):  # the pre-trained toy-world model (deepgen_rl.toy), built once into its cache
        from deepgen_rl.toy.model import ensure_toy_deepgen

        root = ensure_toy_deepgen()["root"]
        for key in ("lmm_path", "sd3_path", "default_checkpoint"):
            if isinstance(cfg.get(key), str):
                cfg[key] = cfg[key].format(toy_dir=root)
    return cfg


def build_from_config(cfg: Mapping[str, Any]) -> DeepGen:
    """Build a `DeepGen` from a resolved config dict (no checkpoint): every part via ``from_pretrained``."""
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel
    from transformers import AutoTokenizer, Qwen2_5_VLForConditionalGeneration

    lmm_path = check_model_dir(cfg.get("lmm_path"), cfg.get("lmm_path_env"), LMM_EXPECTED)
    if not os.path.isfile(os.path.join(lmm_path, "config.json")):
        raise ModelPathError(f"{cfg.get('lmm_path_env') or 'lmm_path'}={lmm_path} has no config.json: "
                             f"expected {LMM_EXPECTED}")
    sd3_path = check_model_dir(cfg.get("sd3_path"), cfg.get("sd3_path_env"), SD3_EXPECTED, SD3_SUBFOLDERS)
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
            max_prompt_tokens=int(cfg.get("max_prompt_tokens", 256)),
            prompt_template=cfg.get("prompt_template", PROMPT_TEMPLATE),
        )
    for module in (model.connector, model.projector_1, model.projector_2, model.projector_3):
        module.to(dtype)
    model.meta_queries.data = model.meta_queries.data.to(dtype)
    return model


def build_model(model_config: str | Mapping[str, Any], checkpoint: str | Sequence[str] | None = None,
                **overrides: Any) -> DeepGen:
    """Build DeepGen from an mmengine ``.py`` model config and load checkpoint(s).

    model_config: path of e.g. ``configs/models/deepgen_sd35m_qwen25vl3b.py`` (real, paths from
        ``$QWEN2_5_VL_MODEL_NAME_OR_PATH`` / ``$SD3_5_MODEL_NAME_OR_PATH``) or ``configs/models/deepgen_tiny.py``
        (tiny random model, created once in `tiny.tiny_dir()`), or an already-parsed dict.
    checkpoint: a DeepGen SFT ``.pth`` (keys in the transformers-4.51 layout are mapped), a ``.safetensors``, or a
        ``deepgen_rl.checkpoint.v1`` directory (its ``dit.safetensors`` replaces the DiT); a list loads in order,
        after the config's ``default_checkpoint``.
    overrides: replace top-level config values (``max_prompt_tokens=…``, ``dtype="float32"``,
        ``default_checkpoint=None`` for a fresh model, …); unknown keys raise.

    Returns the model on CPU with everything but the DiT frozen (`DeepGen.freeze_non_trainable`);
    ``model.load_reports`` lists what each checkpoint loaded.
    """
    cfg = _config_dict(model_config, overrides)
    model = build_from_config(cfg)
    paths = [cfg["default_checkpoint"]] if cfg.get("default_checkpoint") else []
    if checkpoint:
        paths += [checkpoint] if isinstance(checkpoint, (str, os.PathLike)) else list(checkpoint)
    reports: list[LoadReport] = [load_checkpoint(model, os.fspath(p)) for p in paths]
    model.load_reports = reports
    model.freeze_non_trainable()
    return model
