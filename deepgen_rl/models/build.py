"""`build_model`: mmengine model config (+ checkpoint) -> `DeepGen`.

A model config is a plain mmengine ``.py`` file of top-level values (see ``configs/models/``):

    lmm_path, lmm_path_env        Qwen2.5-VL folder (transformers layout) and the env var it came from
    sd3_path, sd3_path_env        diffusers folder with transformer/, vae/, scheduler/
    tiny_preset                   optional: materialise `tiny.tiny_dir(preset)`, substitute "{tiny_dir}" in paths and
                                  take the preset's DeepGen sizes (tiny.PRESETS[preset]["deepgen"])
    prebuilt                      optional: "module:function" returning {"root": folder, ...} once the model files
                                  exist (e.g. the toy-world model, `deepgen_rl.toy.model:ensure_toy_deepgen`);
                                  "{prebuilt_dir}" in paths becomes that folder. Named by the config, imported by
                                  name, so the model layer does not depend on what builds the files
    default_checkpoint            optional checkpoint loaded before the ``checkpoint`` argument
    dtype, vae_dtype              "bfloat16" | "float16" | "float32" (vae_dtype defaults to dtype)
    num_queries, max_prompt_tokens, prompt_template, connector (dict of ConnectorConfig fields),
    lora_rank, lora_alpha         VLM LoRA (lora_rank 0/None = no LoRA), init_seed (fresh connector/think tokens)
"""

from __future__ import annotations

import importlib

import logging
import os
from typing import Any, Mapping, Sequence

from deepgen_rl.checkpoints.sft import LoadReport, load_checkpoint

from .assemble import (LMM_EXPECTED, SD3_EXPECTED, SD3_SUBFOLDERS, ModelPathError, build_from_config,  # noqa: F401
                       check_model_dir, check_model_paths, resolve_dtype)
from .deepgen.model import DeepGen
from .tiny import PRESETS, ensure_tiny_deepgen

logger = logging.getLogger(__name__)


def _config_dict(model_config: str | Mapping[str, Any], overrides: Mapping[str, Any],
                 materialize: bool = True) -> dict[str, Any]:
    """The resolved config dict. ``materialize=False`` (the start-up check) does not build a ``tiny_preset`` or
    ``prebuilt`` model's files (minutes for the toy model) and leaves their "{tiny_dir}"/"{prebuilt_dir}" paths
    unformatted; `build_model` builds them."""
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
        preset = cfg["tiny_preset"]
        if preset not in PRESETS:
            raise KeyError(f"unknown tiny_preset {preset!r}; known: {sorted(PRESETS)}")
        # The preset's DeepGen sizes must match its files; explicit overrides still win.
        cfg.update({k: v for k, v in PRESETS[preset]["deepgen"].items() if k not in overrides})
        if not materialize:
            return cfg
        root = ensure_tiny_deepgen(preset=preset)["root"]
        for key in ("lmm_path", "sd3_path", "default_checkpoint"):
            if isinstance(cfg.get(key), str):
                cfg[key] = cfg[key].format(tiny_dir=root)
    if cfg.get("prebuilt"):  # e.g. the pre-trained toy-world model (deepgen_rl.toy), built once into its cache
        module, _, func = str(cfg["prebuilt"]).partition(":")
        if not module or not func:
            raise ValueError(f"model config: prebuilt must be 'module:function', got {cfg['prebuilt']!r}")
        try:
            builder = getattr(importlib.import_module(module), func)
        except (ImportError, AttributeError) as e:
            raise ValueError(f"model config: prebuilt {cfg['prebuilt']!r} cannot be imported: {e}") from None
        if not materialize:
            return cfg
        root = builder()["root"]
        for key in ("lmm_path", "sd3_path", "default_checkpoint"):
            if isinstance(cfg.get(key), str):
                cfg[key] = cfg[key].format(prebuilt_dir=root)
    return cfg


def check_model_config(model_config: str) -> dict[str, Any]:
    """Start-up check without building anything: the config parses, its model folders and its
    ``default_checkpoint`` exist. A ``tiny_preset`` or ``prebuilt`` model is not built here (its files are ours,
    made by `build_model`), so its paths are not checked. Returns the config, resolved except for those paths."""
    cfg = _config_dict(model_config, {}, materialize=False)
    if cfg.get("tiny_preset") or cfg.get("prebuilt"):
        return cfg
    check_model_paths(cfg)
    ckpt = cfg.get("default_checkpoint")
    if ckpt and not os.path.exists(ckpt):
        raise ModelPathError(f"{model_config}: default_checkpoint {ckpt} does not exist")
    return cfg


def build_model(model_config: str | Mapping[str, Any], checkpoint: str | Sequence[str] | None = None,
                **overrides: Any) -> DeepGen:
    """Build DeepGen from an mmengine ``.py`` model config and load checkpoint(s).

    model_config: path of e.g. ``configs/models/deepgen_sd35m_qwen25vl3b.py`` (real, paths from
        ``$QWEN2_5_VL_MODEL_NAME_OR_PATH`` / ``$SD3_5_MODEL_NAME_OR_PATH``) or ``configs/models/deepgen_tiny.py``
        (tiny random model, created once in `tiny.tiny_dir()`), or an already-parsed dict.
    checkpoint: a DeepGen SFT ``.pth`` (transformers-4.56 keys; the older 4.51 layout is mapped), the SFT training's
        DeepSpeed ``iter_N.pth/`` folder (consolidated on CPU), a ``.safetensors``, or a
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
