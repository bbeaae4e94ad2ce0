"""Save / resume the whole training state of the GRPO trainer (format and atomic writes: ``rl_format``).

Resume policy (one place; rank 0 decides, every rank follows, so ranks never pick different checkpoints):

- auto-resume: stale ``.tmp``/``.old`` folders are cleaned up (``rl_format.remove_stale_tmp``), then the newest
  ``checkpoint-N`` whose every file reads is chosen. A folder that is incomplete or unreadable is moved aside to
  ``checkpoint-N.corrupt`` (never deleted), with a one-line warning naming it and the bad file.
- ``--resume_from_checkpoint PATH``: that checkpoint or a one-line error naming the unreadable file.
- ``--no_auto_resume`` in a folder that holds checkpoints: refused (they belong to another run) unless
  ``--overwrite_output_dir true``, which moves that run's checkpoints and ``metrics.jsonl`` into
  ``previous_run_<time>/`` first.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from deepgen_rl.checkpoints import rl_format as ckpt
from deepgen_rl.checkpoints.rl_format import (DEEPSPEED_DIR, DIT_FILE, EMA_DIT_FILE, CheckpointCorrupt,
                                              read_json_file, read_torch_file)
from deepgen_rl.trainer.deepspeed_utils import fp32_master_state_dict, gathered_params
from deepgen_rl.utils import dist

log = logging.getLogger(__name__)


def _rng_payload() -> dict:
    np_state = np.random.get_state()
    payload = {"python": json.dumps(random.getstate()), "numpy_name": np_state[0],
               "numpy_keys": torch.from_numpy(np_state[1].astype(np.int64)),
               "numpy_pos": int(np_state[2]), "numpy_has_gauss": int(np_state[3]),
               "numpy_cached": float(np_state[4]), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        payload["cuda"] = torch.cuda.get_rng_state_all()
    return payload


def _restore_rng(p: dict) -> None:
    state = json.loads(p["python"])
    random.setstate((state[0], tuple(state[1]), state[2]))
    np.random.set_state((p["numpy_name"], p["numpy_keys"].numpy().astype(np.uint32), p["numpy_pos"],
                         p["numpy_has_gauss"], p["numpy_cached"]))
    torch.set_rng_state(p["torch"])
    if "cuda" in p and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(p["cuda"])


def param_digest(module) -> dict:
    """fp64 sum, sum of squares and element count of a module's parameters (after gathering)."""
    total, sq, count = 0.0, 0.0, 0
    with torch.no_grad():
        for p in module.parameters():
            x = p.detach().double()
            total += float(x.sum())
            sq += float((x * x).sum())
            count += x.numel()
    return {"sum": total, "sum_sq": sq, "numel": count}


class RngState:
    """The process's Python / NumPy / torch (and CUDA) RNG states as one stateful part; one file per rank
    (optional on resume: a checkpoint resumed on more ranks than wrote it has no file for the new ones)."""

    per_rank = True
    optional = True

    def state_dict(self) -> dict:
        return _rng_payload()

    def load_state_dict(self, state: dict) -> None:
        _restore_rng(state)


class DictState:
    """A plain dict (the trainer's counters) as a stateful part: loading updates it in place."""

    def __init__(self, d: dict):
        self.d = d

    def state_dict(self) -> dict:
        return dict(self.d)

    def load_state_dict(self, state: dict) -> None:
        self.d.update(state)


class Part:
    """A stateful part made of two functions: ``get() -> state`` and ``put(state)``."""

    def __init__(self, get: Callable[[], Any], put: Callable[[Any], None], *, optional: bool = False,
                 collective: bool = False, missing_message: str | None = None):
        self.get, self.put = get, put
        self.optional, self.collective, self.missing_message = optional, collective, missing_message

    def state_dict(self):
        return self.get()

    def load_state_dict(self, state) -> None:
        self.put(state)


def _part_files(parts: dict, rank: int) -> dict[str, object]:
    """File name of each part in the checkpoint folder (``name.ext`` -> ``name_rank{R}.ext`` for per-rank parts)."""
    out = {}
    for name, obj in parts.items():
        if getattr(obj, "per_rank", False):
            stem, ext = name.rsplit(".", 1)
            name = f"{stem}_rank{rank}.{ext}"
        out[name] = obj
    return out


def _write_part(obj, path: Path) -> None:
    """By suffix: .json (JSON), .safetensors (tensors), anything else torch.save (all written in place in the
    checkpoint's .tmp folder, which is renamed atomically by ``finalize``)."""
    state = obj.state_dict()
    if path.suffix == ".json":
        ckpt.write_json(path, state)
    elif path.suffix == ".safetensors":
        ckpt.save_tensors(state, path)
    else:
        torch.save(state, path)


def _read_part(path: Path):
    if path.suffix == ".json":
        return read_json_file(path)
    if path.suffix == ".safetensors":
        return ckpt.load_tensors(path)
    return read_torch_file(path)


@dataclass(frozen=True)
class TrainingStateView:
    """What save and resume read and write, passed explicitly (the trainer builds it; these functions never see it).

    ``dit``: the DiT module (DeepSpeed's wrapped module when ``engine`` is set); ``parts``: the trainer's
    ``stateful_parts()``, file name -> object with ``state_dict()`` / ``load_state_dict()`` (optional attributes:
    ``per_rank`` = every rank writes its own file, ``collective`` = every rank must call ``state_dict()`` (rank 0
    writes it), ``optional`` = a missing file is not an error on resume,
    ``missing_message`` = the error after the path when a required file is missing). Save and resume walk the
    same mapping.
    """

    dit: torch.nn.Module
    engine: Any | None
    zero_stage: int
    rank: int
    world: int
    parts: dict[str, Any]


def save_training_checkpoint(view: TrainingStateView, output_dir: str | os.PathLike, step: int, *,
                             args_json: str, run_configs: dict, save_total_limit: int | None,
                             has_ema: bool, debug_delay_s: float = 0.0) -> Path:
    """Collective: every rank calls it. Returns the final checkpoint path."""
    out = Path(output_dir)
    rank = view.rank
    tmp, final = ckpt.tmp_dir_for(out, step), ckpt.final_dir_for(out, step)
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    dist.barrier()
    if view.engine is not None:
        view.engine.save_checkpoint(str(tmp / "deepspeed"), tag=f"global_step{step}")
    masters = fp32_master_state_dict(view.dit, view.engine)  # every rank: ZeRO gathers the fp32 masters
    with gathered_params(view.dit, view.zero_stage):
        if rank == 0:
            ckpt.save_tensors(masters, tmp / DIT_FILE)
        # every rank records a digest of the weights it holds: replicas must agree (checked by tests and users)
        ckpt.write_json(tmp / f"param_digest_rank{rank}.json", param_digest(view.dit))
    for name, obj in _part_files(view.parts, rank).items():  # the one list of training state, as resume reads it
        if rank == 0 or getattr(obj, "per_rank", False):
            _write_part(obj, tmp / name)
        elif getattr(obj, "collective", False):
            obj.state_dict()  # every rank takes part in assembling it (e.g. the partitioned EMA); rank 0 writes
    if rank == 0:
        (tmp / "training_args.json").write_text(args_json)
        cfg_dir = tmp / "configs"
        cfg_dir.mkdir()
        for name, src in run_configs.items():
            if src and Path(src).is_file():
                shutil.copy2(src, cfg_dir / f"{name}{Path(src).suffix}")
        if debug_delay_s > 0:  # test hook: widen the window in which a crash leaves a partial checkpoint
            (tmp / "WRITING").write_text("partial")
            time.sleep(debug_delay_s)
            (tmp / "WRITING").unlink()
    dist.barrier()
    if rank == 0:
        ckpt.finalize(tmp, final, {"global_step": step, "zero_stage": view.zero_stage,
                                   "world_size": view.world, "has_ema": has_ema,
                                   "dit_dtype": "float32"})
        removed = ckpt.rotate(out, save_total_limit)
        log.warning("saved %s%s", final, f" (removed {[p.name for p in removed]})" if removed else "")
    dist.barrier()
    return final


class ResumeError(ValueError):
    """A set-up problem with the output folder or the checkpoint to resume (reported as one line)."""


REQUIRED_JSON = ("sampler_state.json", "counters.json", "trainer_state.json")


def validate_checkpoint(path: str | os.PathLike) -> dict:
    """Read every file that resuming ``path`` needs (only the headers of the large ones) and return its meta.

    Raises FileNotFoundError (incomplete) or :class:`CheckpointCorrupt` naming the first unreadable file.
    """
    path = Path(path)
    meta = ckpt.read_checkpoint_meta(path)
    for name in REQUIRED_JSON:
        if not (path / name).is_file():
            raise CheckpointCorrupt(path / name, "missing")
        read_json_file(path / name)
    for name in (DIT_FILE, EMA_DIT_FILE):
        if (path / name).is_file():
            ckpt.check_safetensors(path / name)
    torch_files = [path / n for n in ("optimizer.pt", "scheduler.pt", "sftaux_state.pt") if (path / n).is_file()]
    torch_files += sorted(path.glob("rng_state_rank*.pt"))
    for f in torch_files:  # ours: read as the resume reads them (weights only), memory-mapped
        read_torch_file(f, mmap=True)
    if (path / DEEPSPEED_DIR).is_dir():  # DeepSpeed's: whole archives (DeepSpeed itself unpickles them on load)
        for f in sorted(f for f in (path / DEEPSPEED_DIR).rglob("*.pt") if f.is_file()):
            ckpt.check_torch_zip(f)
    if not (path / DIT_FILE).is_file() and not (path / DEEPSPEED_DIR).is_dir():
        raise CheckpointCorrupt(path / DIT_FILE, "missing (and no deepspeed/ shards)")
    return meta


def validate_resume_path(resume) -> str | None:
    """None if ``--resume_from_checkpoint resume`` can be resumed, else the one-line reason naming the file."""
    path = Path(resume)
    try:
        validate_checkpoint(path)
    except FileNotFoundError as e:
        return (f"--resume_from_checkpoint {path}: not a complete checkpoint ({e}; partial '.tmp' checkpoints are "
                "never resumed)")
    except CheckpointCorrupt as e:
        return (f"--resume_from_checkpoint {path}: {e}; pass an older checkpoint, or drop the flag to auto-resume "
                "from the newest readable one")
    return None


def _decide_resume(output_dir, resume) -> dict:
    """Rank 0's resume decision as JSON: {"path": str|None, "warnings": [str], "error": str|None}."""
    out = Path(output_dir)
    warnings: list[str] = []
    if resume in (False, "no", "false", "False"):
        return {"path": None, "warnings": warnings, "error": None}
    if resume not in (None, True, "auto", "true", "True", ""):
        error = validate_resume_path(resume)
        return {"path": None if error else str(resume), "warnings": warnings, "error": error}
    ckpt.remove_stale_tmp(out)
    chosen = None
    for folder in reversed(ckpt.checkpoint_dirs(out)):
        try:
            validate_checkpoint(folder)
        except (FileNotFoundError, CheckpointCorrupt) as e:
            moved = ckpt.move_aside(folder)
            warnings.append(f"checkpoint {folder.name} is unusable ({e}): moved aside to {moved.name}; resuming "
                            "from an older checkpoint")
            continue
        chosen = folder
        break
    return {"path": str(chosen) if chosen else None, "warnings": warnings, "error": None}


def find_resume_checkpoint(output_dir, resume) -> Path | None:
    """Collective: rank 0 decides which checkpoint to resume (cleaning up and moving damaged folders aside) and
    every rank receives that decision (JSON over ``all_gather_json``, no pickle): ranks cannot diverge.

    ``resume``: a path, True/"auto"/None (newest readable checkpoint in output_dir, if any), or False/"no".
    Raises :class:`ResumeError` for an unusable explicit path.
    """
    decision = _decide_resume(output_dir, resume) if dist.rank() == 0 else None
    decision = dist.all_gather_json(decision)[0]
    for w in decision["warnings"]:
        log.warning("%s", w)
    if decision["error"]:
        raise ResumeError(decision["error"])
    return Path(decision["path"]) if decision["path"] else None


def check_output_dir(output_dir, resume, overwrite: bool) -> None:
    """Start-up check of ``--output_dir`` (rank 0, before the model is built): it must be a writable folder, and a
    run that starts over (``--no_auto_resume``) must not mix its checkpoints with another run's."""
    out = Path(output_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".write_test_{os.getpid()}"
        probe.write_text("ok")
        probe.unlink()
    except OSError as e:
        raise ResumeError(f"--output_dir {out}: not writable ({e.strerror or e})") from None
    if resume not in (False, "no", "false", "False"):
        return
    previous = ckpt.checkpoint_dirs(out) + sorted(out.glob("checkpoint-*.tmp")) + sorted(out.glob("checkpoint-*.old"))
    if not previous:
        return
    if not overwrite:
        raise ResumeError(
            f"--output_dir {out} holds another run's checkpoints ({', '.join(p.name for p in previous[:3])}"
            f"{' …' if len(previous) > 3 else ''}) and --no_auto_resume starts over: drop --no_auto_resume to resume "
            "them, choose a new --output_dir, or pass --overwrite_output_dir true to move them aside")
    aside = out / f"previous_run_{time.strftime('%Y%m%d_%H%M%S')}"
    i = 0
    while aside.exists():
        i += 1
        aside = out / f"previous_run_{time.strftime('%Y%m%d_%H%M%S')}_{i}"
    aside.mkdir()
    for p in previous + [f for f in (out / "metrics.jsonl",) if f.exists()]:
        os.rename(p, aside / p.name)
    log.warning("--overwrite_output_dir: moved the previous run's %s into %s",
                [p.name for p in previous], aside)


def truncate_metrics(output_dir, step: int) -> None:
    """Keep ``metrics.jsonl`` lines with step <= ``step`` (the resumed step), so a redone step never appears twice;
    dropped lines go to ``metrics.superseded.jsonl`` (appended), not lost. Rank 0 only."""
    path = Path(output_dir) / "metrics.jsonl"
    if not path.is_file():
        return
    keep, drop = [], []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        try:
            s = int(json.loads(line).get("step", 0))
        except (ValueError, AttributeError):
            s = step + 1  # an unreadable line (e.g. cut by a crash) cannot be trusted
        (keep if s <= step else drop).append(line)
    if not drop:
        return
    with open(path.with_name("metrics.superseded.jsonl"), "a", encoding="utf-8") as f:
        f.write("\n".join(drop) + "\n")
    part = path.with_name(path.name + ".part")
    part.write_text("".join(x + "\n" for x in keep), encoding="utf-8")
    os.replace(part, path)
    log.warning("metrics.jsonl: %d line(s) after step %d moved to metrics.superseded.jsonl (steps redone)",
                len(drop), step)


def load_training_checkpoint(view: TrainingStateView, path: Path) -> int:
    """Restore the DiT (or the DeepSpeed engine) and every entry of ``view.parts`` from ``path``; returns its step."""
    meta = ckpt.read_checkpoint_meta(path)
    step = int(meta["global_step"])
    rank = view.rank
    if view.engine is not None:
        if not (path / DEEPSPEED_DIR).is_dir():
            raise ValueError(f"{path} was written without DeepSpeed; resume it without --deepspeed")
        view.engine.load_checkpoint(str(path / DEEPSPEED_DIR), tag=f"global_step{step}",
                                    load_optimizer_states=True, load_lr_scheduler_states=True)
    else:
        if not (path / "optimizer.pt").is_file():
            raise ValueError(f"{path} was written under DeepSpeed; resume it with the same --deepspeed config")
        state = ckpt.load_tensors(path / DIT_FILE)
        ref = view.dit.state_dict()
        view.dit.load_state_dict({k: v.to(ref[k].dtype) for k, v in state.items()})
    for name, obj in _part_files(view.parts, rank).items():  # the same list save_training_checkpoint wrote
        file = path / name
        if not file.is_file():
            if getattr(obj, "optional", False):
                continue
            raise ValueError(f"{path} {getattr(obj, 'missing_message', None) or f'has no {name}'}")
        obj.load_state_dict(_read_part(file))
    if rank == 0:
        log.warning("resumed from %s (step %d)", path, step)
    return step
