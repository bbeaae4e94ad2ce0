"""Checkpoint directories (format ``deepgen_rl.checkpoint.v1``, see docs/architecture.md).

A checkpoint is written into ``checkpoint-N.tmp`` and renamed to ``checkpoint-N`` only when every file is in
place, ``checkpoint_meta.json`` last; a directory without that file (or with a ``.tmp`` suffix) is incomplete
and ignored on resume, so a crash while saving never corrupts the run.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

# one definition of the format, shared with the readers (conversion, build_model)
from deepgen_rl.utils.checkpoint_io import CHECKPOINT_FORMAT as FORMAT
from deepgen_rl.utils.checkpoint_io import META_FILE as META
from deepgen_rl.utils.checkpoint_io import read_checkpoint_meta

_CKPT_RE = re.compile(r"^checkpoint-(\d+)$")


def _has_valid_meta(path: Path) -> bool:
    try:
        read_checkpoint_meta(path)
        return True
    except (OSError, ValueError):  # missing/unreadable meta, malformed JSON (a ValueError), wrong format
        return False


def is_complete(path: str | os.PathLike) -> bool:
    path = Path(path)
    return bool(_CKPT_RE.match(path.name)) and _has_valid_meta(path)


def list_checkpoints(output_dir: str | os.PathLike) -> list[Path]:
    """Complete checkpoints in ``output_dir``, oldest first."""
    out = Path(output_dir)
    if not out.is_dir():
        return []
    found = [p for p in out.iterdir() if p.is_dir() and is_complete(p)]
    return sorted(found, key=lambda p: int(_CKPT_RE.match(p.name).group(1)))


def latest_checkpoint(output_dir: str | os.PathLike) -> Path | None:
    ckpts = list_checkpoints(output_dir)
    return ckpts[-1] if ckpts else None


def tmp_dir_for(output_dir: str | os.PathLike, step: int) -> Path:
    return Path(output_dir) / f"checkpoint-{step}.tmp"


def final_dir_for(output_dir: str | os.PathLike, step: int) -> Path:
    return Path(output_dir) / f"checkpoint-{step}"


def save_tensors(state: dict[str, torch.Tensor], path: Path, dtype=torch.float32) -> None:
    save_file({k: v.detach().to("cpu", dtype).contiguous() for k, v in state.items()}, str(path))


def load_tensors(path: Path) -> dict[str, torch.Tensor]:
    return load_file(str(path))


def write_json(path: Path, obj) -> None:
    tmp = path.with_suffix(path.suffix + ".part")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str))
    os.replace(tmp, path)


def _fsync_path(path: Path) -> None:
    fd = os.open(str(path), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def finalize(tmp: Path, final: Path, meta: dict) -> None:
    """Make ``tmp`` the checkpoint ``final``: every file fsynced, the meta file written last, then renamed.

    A stale ``final`` (the same step written again, e.g. after resuming from an older checkpoint) is first moved to
    ``final.old`` and deleted only after the new one is in place, so a crash never leaves no copy of the step.
    """
    meta = {"format": FORMAT, **meta}
    for f in sorted(tmp.rglob("*")):
        if f.is_file():
            _fsync_path(f)
    write_json(tmp / META, meta)
    _fsync_path(tmp / META)
    _fsync_path(tmp)
    old = final.with_name(final.name + ".old")
    if final.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.rename(final, old)
    os.rename(tmp, final)
    _fsync_path(final.parent)
    shutil.rmtree(old, ignore_errors=True)


def rotate(output_dir: str | os.PathLike, keep: int | None) -> list[Path]:
    """Delete the oldest complete checkpoints beyond ``keep`` (None/0 keeps all). Returns what was removed."""
    if not keep or keep <= 0:
        return []
    ckpts = list_checkpoints(output_dir)
    removed = ckpts[:-keep]
    for p in removed:
        shutil.rmtree(p, ignore_errors=True)
    return removed


def remove_stale_tmp(output_dir: str | os.PathLike) -> None:
    """Clean up after a crash while saving (rank 0, before resuming).

    ``checkpoint-N.tmp`` without a meta file is partial: deleted. With a valid meta file it was complete and only the
    final rename was missed: promoted to ``checkpoint-N`` (if that does not exist). ``checkpoint-N.old`` is the
    replaced copy of a re-written step: deleted when ``checkpoint-N`` exists, restored otherwise.
    """
    out = Path(output_dir)
    if not out.is_dir():
        return
    for tmp in out.glob("checkpoint-*.tmp"):
        final = tmp.with_name(tmp.name[: -len(".tmp")])
        if _has_valid_meta(tmp) and not final.exists():
            os.rename(tmp, final)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    for old in out.glob("checkpoint-*.old"):
        final = old.with_name(old.name[: -len(".old")])
        if final.exists():
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(old, final)
