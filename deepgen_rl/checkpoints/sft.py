"""DeepGen SFT checkpoints: read (``.pth``, ``.safetensors``, the SFT training's raw DeepSpeed ZeRO folder, our RL
checkpoint directories), key map, and export.

DeepGen SFT checkpoints were written with transformers 4.56, whose ``Qwen2_5_VLForConditionalGeneration`` nests the
text decoder and the vision tower under ``model`` — the layout of the installed transformers, so their keys load as
they are (``lmm.model.language_model.layers.N…``, ``lmm.model.visual…``). Checkpoints from transformers 4.51 (decoder
and vision tower side by side) still load; their keys are mapped:

    lmm.model.layers.N…        -> lmm.model.language_model.layers.N…
    lmm.model.embed_tokens…    -> lmm.model.language_model.embed_tokens…
    lmm.model.norm…            -> lmm.model.language_model.norm…
    lmm.visual…                -> lmm.model.visual…
    lmm.lm_head…               -> lmm.lm_head… (unchanged)

PEFT spellings are normalised too: a ``lmm.base_model.model.`` wrapper prefix is dropped, adapter-less LoRA names
(``lora_A.weight``, as in saved adapters) get the ``default`` adapter, and a base weight saved without
``base_layer`` lands on ``…base_layer.weight`` when the model carries a LoRA there.

The SFT training (mmengine's DeepSpeed strategy) saves ``WORK_DIR/iter_N.pth/`` as a DeepSpeed checkpoint folder:
``engine.save_checkpoint(WORK_DIR, tag="iter_N.pth")`` writes ``mp_rank_00_model_states.pt`` and one
``*_optim_states.pt`` per rank into it. :func:`read_checkpoint` consolidates such a folder on CPU into one fp32 state
dict (``deepspeed.utils.zero_to_fp32``, as for our RL checkpoints' ``deepspeed/`` shards), no GPU needed.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field
from typing import Iterable, Mapping

import torch
from torch import nn

from deepgen_rl.checkpoints.rl_format import DIT_FILE, META_FILE, consolidate_zero_checkpoint

logger = logging.getLogger(__name__)

# (4.51 prefix, installed prefix); order matters only in that prefixes are disjoint.
LEGACY_PREFIXES: tuple[tuple[str, str], ...] = (
    ("lmm.model.layers.", "lmm.model.language_model.layers."),
    ("lmm.model.embed_tokens.", "lmm.model.language_model.embed_tokens."),
    ("lmm.model.norm.", "lmm.model.language_model.norm."),
    ("lmm.visual.", "lmm.model.visual."),
)
# Keys a DeepGen SFT checkpoint may hold that have no counterpart here (EMA copies, CLIP-norm buffers).
IGNORABLE_UNEXPECTED = re.compile(r"^(ema\.|vit_mean$|vit_std$|train_scheduler\.|test_scheduler\.)")


@dataclass
class LoadReport:
    """What one checkpoint did to the model (keys in the model's own layout)."""

    path: str
    loaded: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # model keys we expected but did not get
    ignored: list[str] = field(default_factory=list)  # known-ignorable checkpoint keys


class CheckpointKeyError(KeyError):
    pass


def to_installed_key(key: str) -> str:
    """Map one checkpoint key from the transformers-4.51 / peft layout to the installed layout (pure string map)."""
    if key.startswith("lmm.base_model.model."):
        key = "lmm." + key[len("lmm.base_model.model."):]
    for old, new in LEGACY_PREFIXES:
        if key.startswith(old):
            key = new + key[len(old):]
            break
    key = re.sub(r"\.(lora_[AB])\.weight$", r".\1.default.weight", key)
    key = re.sub(r"\.(lora_embedding_[AB])$", r".\1.default", key)
    return key


def to_legacy_key(key: str) -> str:
    """Inverse of `to_installed_key` for keys of our own model (used to write 4.51-layout checkpoints)."""
    for old, new in LEGACY_PREFIXES:
        if key.startswith(new):
            return old + key[len(new):]
    return key


def to_legacy_layout(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {to_legacy_key(k): v for k, v in state_dict.items()}


def is_sft_key(key: str) -> bool:
    """True for the keys a DeepGen SFT checkpoint carries: all but the VLM base weights and the VAE."""
    return not key.startswith("vae.") and not (key.startswith("lmm.") and ".lora_" not in key)


def export_sft_state_dict(model: nn.Module, legacy: bool = False) -> dict[str, torch.Tensor]:
    """``model``'s SFT-checkpoint tensors (VLM LoRA, connector, projectors, meta_queries, transformer.*), detached
    on CPU, in the installed (transformers 4.56) key layout that DeepGen's own SFT checkpoints use and its evaluation
    scripts load; ``legacy=True`` writes the transformers-4.51 layout instead."""
    state = {k: v.detach().cpu() for k, v in model.state_dict().items() if is_sft_key(k)}
    return to_legacy_layout(state) if legacy else state


def is_zero_folder(path: str | os.PathLike) -> bool:
    """True for a DeepSpeed checkpoint tag folder (``…model_states.pt`` inside), e.g. SFT training's ``iter_N.pth/``."""
    return os.path.isdir(path) and any(name.endswith("model_states.pt") for name in os.listdir(path))


def is_rl_checkpoint_dir(path: str | os.PathLike) -> bool:
    return os.path.isdir(path) and (os.path.isfile(os.path.join(path, DIT_FILE))
                                    or os.path.isfile(os.path.join(path, META_FILE)))


def read_checkpoint(path: str) -> dict[str, torch.Tensor]:
    """Raw state dict of ``path``: a ``.pth``/``.pt``/``.bin`` file (optionally {"state_dict"|"module": …}), a
    ``.safetensors`` file, the SFT training's DeepSpeed ZeRO folder (``iter_N.pth/``, consolidated to fp32 on CPU),
    or a ``deepgen_rl.checkpoint.v1`` directory (its ``dit.safetensors``, keys prefixed with ``transformer.``)."""
    from safetensors.torch import load_file

    if os.path.isdir(path):
        if is_zero_folder(path) and not is_rl_checkpoint_dir(path):
            parent, tag = os.path.split(os.path.normpath(path))
            return consolidate_zero_checkpoint(parent, tag)
        dit = os.path.join(path, DIT_FILE)
        if not os.path.isfile(dit):
            raise FileNotFoundError(f"checkpoint directory {path} has neither {DIT_FILE} (an RL checkpoint) nor "
                                    "DeepSpeed *model_states.pt files (an SFT training's iter_N.pth/ folder)")
        return {f"transformer.{k}": v for k, v in load_file(dit).items()}
    if not os.path.isfile(path):
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    if path.endswith(".safetensors"):
        return load_file(path)
    obj = torch.load(path, map_location="cpu", weights_only=True)
    for wrapper in ("state_dict", "module"):
        if isinstance(obj, dict) and wrapper in obj and isinstance(obj[wrapper], dict):
            obj = obj[wrapper]
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise ValueError(f"{path}: expected a state dict of tensors")
    return obj


def map_state_dict(state_dict: Mapping[str, torch.Tensor], model_keys: Iterable[str]
                   ) -> tuple[dict[str, torch.Tensor], list[str], list[str]]:
    """(mapped state dict in the model's layout, ignored checkpoint keys, unexpected checkpoint keys)."""
    model_keys = set(model_keys)
    mapped: dict[str, torch.Tensor] = {}
    ignored, unexpected = [], []
    for key, value in state_dict.items():
        new = to_installed_key(key)
        if new not in model_keys:
            base = re.sub(r"\.(weight|bias)$", r".base_layer.\1", new)
            if base in model_keys:
                new = base
        if new in model_keys:
            if new in mapped:
                raise CheckpointKeyError(f"two checkpoint keys map to {new}")
            mapped[new] = value
        elif IGNORABLE_UNEXPECTED.match(key):
            ignored.append(key)
        else:
            unexpected.append(key)
    return mapped, ignored, unexpected


def _expected_keys(model_keys: Iterable[str], dit_only: bool) -> set[str]:
    """Keys a full SFT checkpoint must provide: all but the VLM base weights and the VAE (loaded from_pretrained)."""
    return {k for k in model_keys if is_sft_key(k) and (not dit_only or k.startswith("transformer."))}


def shape_mismatches(state: Mapping[str, torch.Tensor], own: Mapping[str, torch.Tensor]) -> list[str]:
    """``"key: checkpoint (shape) vs model (shape)"`` for every key of ``state`` that ``own`` holds with another
    shape (keys ``own`` lacks are the caller's to report)."""
    return [f"{k}: checkpoint {tuple(v.shape)} vs model {tuple(own[k].shape)}"
            for k, v in state.items() if k in own and v.shape != own[k].shape]


def load_checkpoint(model: nn.Module, path: str) -> LoadReport:
    """Load ``path`` into ``model`` (strict on unknown keys and shapes, logs what is missing).

    Raises `CheckpointKeyError` for checkpoint keys that map to nothing in the model and are not known-ignorable,
    and for shape mismatches. Missing keys are logged (a DiT-only directory checks only ``transformer.*``).
    """
    raw = read_checkpoint(path)
    own = model.state_dict()
    mapped, ignored, unexpected = map_state_dict(raw, own.keys())
    if unexpected:
        hint = " (the checkpoint has a VLM LoRA: set lora_rank in the model config)" if any(
            ".lora_" in k for k in unexpected) else ""
        raise CheckpointKeyError(f"{path}: {len(unexpected)} unexpected key(s){hint}: {sorted(unexpected)[:10]}")
    bad_shapes = shape_mismatches(mapped, own)
    if bad_shapes:
        raise CheckpointKeyError(f"{path}: shape mismatch: {bad_shapes[:10]}")
    model.load_state_dict(mapped, strict=False)
    expected = _expected_keys(own.keys(), dit_only=is_rl_checkpoint_dir(path))
    report = LoadReport(path=path, loaded=sorted(mapped), missing=sorted(expected - set(mapped)), ignored=ignored)
    logger.info("loaded %d tensors from %s (%d ignored)", len(report.loaded), path, len(ignored))
    if report.missing:
        logger.warning("%s: %d expected key(s) missing, left at their initial values: %s", path,
                       len(report.missing), report.missing[:20])
    return report
