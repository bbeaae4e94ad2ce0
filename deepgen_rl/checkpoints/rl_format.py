"""The RL checkpoint format ``deepgen_rl.checkpoint.v1``: constants, readers, and atomic directory writes.

Layout (docs/architecture.md, "Checkpoints"): ``checkpoint-N/`` holds ``checkpoint_meta.json`` (written last: it marks
a complete directory), the DiT in ``dit.safetensors`` (and ``ema_dit.safetensors``) with plain
``SD3Transformer2DModel.state_dict()`` keys, or — when those files are absent — only in the DeepSpeed ZeRO shards under
``deepspeed/`` (``engine.save_checkpoint(..., tag="global_stepN")``). The DeepSpeed engine wraps the DiT module
itself, so shard keys are DiT keys; a ``module.`` prefix (an engine around a wrapper) is stripped.

A checkpoint is written into ``checkpoint-N.tmp`` and renamed to ``checkpoint-N`` only when every file is in place;
a directory without a readable meta file (or with a ``.tmp`` suffix) is incomplete and never resumed. A folder whose
files turn out unreadable is moved aside to ``checkpoint-N.corrupt`` (never deleted: :func:`move_aside`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

CHECKPOINT_FORMAT = "deepgen_rl.checkpoint.v1"
META_FILE = "checkpoint_meta.json"
DIT_FILE = "dit.safetensors"
EMA_DIT_FILE = "ema_dit.safetensors"
DEEPSPEED_DIR = "deepspeed"
SFT_DIT_PREFIX = "transformer."


class CheckpointCorrupt(ValueError):
    """A checkpoint file exists but cannot be read (truncated, garbage, wrong format). ``path`` names the file."""

    def __init__(self, path: str | os.PathLike, problem: str):
        self.path = Path(path)
        super().__init__(f"{self.path}: {problem}")


def read_checkpoint_meta(checkpoint_dir: str | os.PathLike) -> dict:
    """``checkpoint_meta.json`` of a complete checkpoint.

    Raises FileNotFoundError for a missing directory or meta file (an incomplete checkpoint) and
    :class:`CheckpointCorrupt` (a ValueError) for a meta file that is not valid JSON of this format.
    """
    checkpoint_dir = Path(checkpoint_dir)
    if not checkpoint_dir.is_dir():
        raise FileNotFoundError(f"checkpoint directory not found: {checkpoint_dir}")
    meta_path = checkpoint_dir / META_FILE
    if not meta_path.is_file():
        raise FileNotFoundError(f"{checkpoint_dir} has no {META_FILE}: not a complete {CHECKPOINT_FORMAT} checkpoint")
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointCorrupt(meta_path, f"unreadable ({type(e).__name__}: {e})") from None
    if not isinstance(meta, dict) or meta.get("format") != CHECKPOINT_FORMAT:
        got = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
        raise CheckpointCorrupt(meta_path, f"format {got!r}, expected {CHECKPOINT_FORMAT!r}")
    if not isinstance(meta.get("global_step"), int):
        raise CheckpointCorrupt(meta_path, f"global_step {meta.get('global_step')!r} is not an integer")
    return meta


def check_safetensors(path: str | os.PathLike) -> None:
    """Raise :class:`CheckpointCorrupt` unless ``path`` is a whole safetensors file (header parses, and the file is
    exactly 8 + header + data bytes long). Reads only the header: cheap for a 9 GB DiT."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise ValueError(f"{size} bytes: shorter than the 8-byte header length")
            n = int.from_bytes(head, "little")
            if n > size - 8:
                raise ValueError(f"header length {n} exceeds the file ({size} bytes)")
            header = json.loads(f.read(n))
        ends = [int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"]
        if 8 + n + max(ends, default=0) != size:
            raise ValueError(f"{size} bytes, but the header describes {8 + n + max(ends, default=0)}")
    except (OSError, ValueError, KeyError, TypeError, IndexError) as e:
        raise CheckpointCorrupt(path, f"not a whole safetensors file ({e})") from None


def read_torch_file(path: str | os.PathLike, mmap: bool = False):
    """``torch.load(path, weights_only=True)`` on CPU; an unreadable file raises :class:`CheckpointCorrupt`."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except FileNotFoundError:
        raise
    except Exception as e:  # torch raises RuntimeError, OSError, UnpicklingError, EOFError … for a damaged file
        raise CheckpointCorrupt(path, f"unreadable torch file ({type(e).__name__}: {str(e).splitlines()[0][:200]})"
                                ) from None


def check_torch_zip(path: str | os.PathLike) -> None:
    """Raise :class:`CheckpointCorrupt` unless ``path`` is a whole ``torch.save`` zip archive (its central directory,
    at the end of the file, reads). For files we do not unpickle ourselves (DeepSpeed's shards); cheap at any size."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as z:
            if not z.namelist():
                raise ValueError("empty archive")
    except (OSError, ValueError, zipfile.BadZipFile) as e:
        raise CheckpointCorrupt(path, f"not a whole torch.save archive ({e})") from None


def read_json_file(path: str | os.PathLike):
    """JSON content of ``path``; an unreadable file raises :class:`CheckpointCorrupt`."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointCorrupt(path, f"unreadable JSON ({type(e).__name__}: {e})") from None


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


def consolidate_zero_checkpoint(ds_dir: str | os.PathLike, tag: str | None = None) -> dict[str, torch.Tensor]:
    """Consolidate ZeRO-1/2/3 shards under ``ds_dir/<tag>`` into one fp32 state dict on CPU (no GPU needed); the
    keys are those of the module the engine wrapped (a ``module.`` prefix is stripped)."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    state_dict = get_fp32_state_dict_from_zero_checkpoint(str(ds_dir), tag=tag)
    return {k: v.detach().clone().contiguous() for k, v in strip_prefix(dict(state_dict)).items()}


def load_dit_state_dict(checkpoint_dir: str | os.PathLike, use_ema: bool = False) -> dict[str, torch.Tensor]:
    """DiT weights of an RL checkpoint, keys = ``SD3Transformer2DModel.state_dict()`` keys (no prefix), on CPU.

    Order: ``ema_dit.safetensors`` if ``use_ema`` (an error if the checkpoint has no EMA), else ``dit.safetensors``,
    else the consolidated DeepSpeed shards under ``deepspeed/``. Tensors keep their stored dtype (fp32 in our
    checkpoints).
    """
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
        return consolidate_zero_checkpoint(ds_dir, _deepspeed_tag(ds_dir, meta))
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


# ---------------------------------------------------------------- checkpoint directories (written by the trainer)
_CKPT_RE = re.compile(r"^checkpoint-(\d+)$")


def _has_valid_meta(path: Path) -> bool:
    try:
        read_checkpoint_meta(path)
        return True
    except (OSError, ValueError):  # missing/unreadable meta, malformed JSON (a ValueError), wrong format
        return False


def step_of(path: str | os.PathLike) -> int | None:
    """N of a ``checkpoint-N`` folder name, else None."""
    m = _CKPT_RE.match(Path(path).name)
    return int(m.group(1)) if m else None


def checkpoint_dirs(output_dir: str | os.PathLike) -> list[Path]:
    """Every ``checkpoint-N`` folder in ``output_dir``, complete or not, oldest first."""
    out = Path(output_dir)
    if not out.is_dir():
        return []
    return sorted((p for p in out.iterdir() if p.is_dir() and step_of(p) is not None), key=step_of)


def move_aside(path: str | os.PathLike, suffix: str = ".corrupt") -> Path:
    """Rename ``path`` to ``path<suffix>`` (``<suffix>.1``, ``.2`` … when taken); never deletes. Returns the new path."""
    path = Path(path)
    target = path.with_name(path.name + suffix)
    i = 0
    while target.exists():
        i += 1
        target = path.with_name(f"{path.name}{suffix}.{i}")
    os.rename(path, target)
    return target


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
    meta = {"format": CHECKPOINT_FORMAT, **meta}
    for f in sorted(tmp.rglob("*")):
        if f.is_file():
            _fsync_path(f)
    write_json(tmp / META_FILE, meta)
    _fsync_path(tmp / META_FILE)
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
