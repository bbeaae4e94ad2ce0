"""Reading our RL checkpoints' DiT weights and writing torch files atomically.

Checkpoint format ``deepgen_rl.checkpoint.v1`` (docs/architecture.md, "Checkpoints"): ``checkpoint_meta.json`` marks a
complete directory; the DiT is in ``dit.safetensors`` (and ``ema_dit.safetensors``) with plain
``SD3Transformer2DModel.state_dict()`` keys, or — when those files are absent — only in the DeepSpeed ZeRO shards
under ``deepspeed/`` (``engine.save_checkpoint(..., tag="global_stepN")``). The DeepSpeed engine wraps the DiT module
itself, so shard keys are DiT keys; a ``module.`` prefix (an engine around a wrapper) is stripped.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import torch

CHECKPOINT_FORMAT = "deepgen_rl.checkpoint.v1"
META_FILE = "checkpoint_meta.json"
DIT_FILE = "dit.safetensors"
EMA_DIT_FILE = "ema_dit.safetensors"
DEEPSPEED_DIR = "deepspeed"
SFT_DIT_PREFIX = "transformer."


def read_checkpoint_meta(checkpoint_dir: str | os.PathLike) -> dict:
    """``checkpoint_meta.json`` of a complete checkpoint; raises for a missing/incomplete directory."""
    checkpoint_dir = Path(checkpoint_dir)
    if not checkpoint_dir.is_dir():
        raise FileNotFoundError(f"checkpoint directory not found: {checkpoint_dir}")
    meta_path = checkpoint_dir / META_FILE
    if not meta_path.is_file():
        raise FileNotFoundError(f"{checkpoint_dir} has no {META_FILE}: not a complete {CHECKPOINT_FORMAT} checkpoint")
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    if meta.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{meta_path}: format {meta.get('format')!r}, expected {CHECKPOINT_FORMAT!r}")
    return meta


def strip_prefix(state_dict: dict[str, torch.Tensor], prefix: str = "module.") -> dict[str, torch.Tensor]:
    """Drop ``prefix`` from the keys if *every* key carries it (a partial prefix is left alone)."""
    if state_dict and all(k.startswith(prefix) for k in state_dict):
        return {k[len(prefix):]: v for k, v in state_dict.items()}
    return state_dict


def _deepspeed_tag(ds_dir: Path, meta: dict) -> str:
    latest = ds_dir / "latest"
    if latest.is_file():
        return latest.read_text(encoding="utf-8").strip()
    tag = f"global_step{meta.get('global_step')}"
    if (ds_dir / tag).is_dir():
        return tag
    tags = sorted(p.name for p in ds_dir.iterdir() if p.is_dir())
    if len(tags) == 1:
        return tags[0]
    raise FileNotFoundError(f"{ds_dir}: no 'latest' file and cannot choose a tag among {tags}")


def load_deepspeed_dit_state_dict(ds_dir: str | os.PathLike, tag: str | None = None) -> dict[str, torch.Tensor]:
    """Consolidate ZeRO-1/2/3 shards under ``ds_dir/<tag>`` into one fp32 state dict on CPU (no GPU needed)."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    state_dict = get_fp32_state_dict_from_zero_checkpoint(str(ds_dir), tag=tag)
    return {k: v.detach().clone().contiguous() for k, v in strip_prefix(dict(state_dict)).items()}


def load_dit_state_dict(checkpoint_dir: str | os.PathLike, use_ema: bool = False) -> dict[str, torch.Tensor]:
    """DiT weights of an RL checkpoint, keys = ``SD3Transformer2DModel.state_dict()`` keys (no prefix), on CPU.

    Order: ``ema_dit.safetensors`` if ``use_ema`` (an error if the checkpoint has no EMA), else ``dit.safetensors``,
    else the consolidated DeepSpeed shards under ``deepspeed/``. Tensors keep their stored dtype (fp32 in our
    checkpoints).
    """
    from safetensors.torch import load_file

    checkpoint_dir = Path(checkpoint_dir)
    meta = read_checkpoint_meta(checkpoint_dir)
    if use_ema:
        ema_path = checkpoint_dir / EMA_DIT_FILE
        if not ema_path.is_file():
            raise FileNotFoundError(f"--use_ema: {ema_path} not found (checkpoint has_ema={meta.get('has_ema')}); "
                                    "EMA weights are only saved as ema_dit.safetensors")
        return strip_prefix(load_file(str(ema_path), device="cpu"))
    dit_path = checkpoint_dir / DIT_FILE
    if dit_path.is_file():
        return strip_prefix(load_file(str(dit_path), device="cpu"))
    ds_dir = checkpoint_dir / DEEPSPEED_DIR
    if ds_dir.is_dir():
        return load_deepspeed_dit_state_dict(ds_dir, _deepspeed_tag(ds_dir, meta))
    raise FileNotFoundError(f"{checkpoint_dir}: neither {DIT_FILE} nor {DEEPSPEED_DIR}/ found")


def dit_source(checkpoint_dir: str | os.PathLike, use_ema: bool = False) -> str:
    """Which file(s) :func:`load_dit_state_dict` reads, in words (for logs)."""
    checkpoint_dir = Path(checkpoint_dir)
    if use_ema:
        return str(checkpoint_dir / EMA_DIT_FILE)
    if (checkpoint_dir / DIT_FILE).is_file():
        return str(checkpoint_dir / DIT_FILE)
    return f"{checkpoint_dir / DEEPSPEED_DIR} (ZeRO shards, consolidated to fp32)"


def atomic_torch_save(obj, path: str | os.PathLike) -> None:
    """``torch.save`` to a temporary file in the destination folder, fsync, then ``os.replace`` onto ``path``: a
    reader never sees a partial file and an interrupted write leaves the old file (if any) intact."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; give the file the usual permissions
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
