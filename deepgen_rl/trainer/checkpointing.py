"""Checkpoint directories (format ``deepgen_rl.checkpoint.v1``, see docs/architecture.md).

A checkpoint is written into ``checkpoint-N.tmp`` and renamed to ``checkpoint-N`` only when every file is in
place, ``checkpoint_meta.json`` last; a directory without that file (or with a ``.tmp`` suffix) is incomplete
and ignored on resume, so a crash while saving never corrupts the run.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

FORMAT = "deepgen_rl.checkpoint.v1"
META = "checkpoint_meta.json"
_CKPT_RE = re.compile(r"^checkpoint-(\d+)$")


def is_complete(path: str | os.PathLike) -> bool:
    path = Path(path)
    if not _CKPT_RE.match(path.name) or not (path / META).is_file():
        return False
    try:
        return json.loads((path / META).read_text()).get("format") == FORMAT
    except (OSError, json.JSONDecodeError):
        return False


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


def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def write_json(path: Path, obj) -> None:
    tmp = path.with_suffix(path.suffix + ".part")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str))
    os.replace(tmp, path)


def finalize(tmp: Path, final: Path, meta: dict) -> None:
    """Write the meta file last, fsync, then atomically move the directory into place."""
    meta = {"format": FORMAT, **meta}
    write_json(tmp / META, meta)
    fd = os.open(str(tmp), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    if final.exists():  # a stale copy of the same step (e.g. re-run after resume): replace it
        shutil.rmtree(final)
    os.rename(tmp, final)


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
    out = Path(output_dir)
    if out.is_dir():
        for p in out.glob("checkpoint-*.tmp"):
            shutil.rmtree(p, ignore_errors=True)
