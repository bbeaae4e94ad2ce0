"""Save / resume the whole training state (see ``checkpointing`` for the on-disk format and atomicity)."""

from __future__ import annotations

import json
import logging
import random
import shutil
import time
from pathlib import Path

import numpy as np
import torch
from transformers import TrainerState

from deepgen_rl.trainer import checkpointing as ckpt
from deepgen_rl.trainer.deepspeed_utils import fp32_master_state_dict, gathered_params
from deepgen_rl.utils import dist
from deepgen_rl.utils.checkpoint_io import DIT_FILE, EMA_DIT_FILE

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


def save_training_checkpoint(trainer, step: int) -> Path:
    """Collective: every rank calls it. Returns the final checkpoint path."""
    args = trainer.args
    out = Path(args.output_dir)
    rank = trainer.rank
    tmp, final = ckpt.tmp_dir_for(out, step), ckpt.final_dir_for(out, step)
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    dist.barrier()
    if trainer.engine is not None:
        trainer.engine.save_checkpoint(str(tmp / "deepspeed"), tag=f"global_step{step}")
    masters = fp32_master_state_dict(trainer.dit_module, trainer.engine)  # every rank: ZeRO gathers the masters
    with gathered_params(trainer.dit_module, trainer.zero_stage):
        if rank == 0:
            ckpt.save_tensors(masters, tmp / DIT_FILE)
        # every rank records a digest of the weights it holds: replicas must agree (checked by tests and users)
        ckpt.write_json(tmp / f"param_digest_rank{rank}.json", param_digest(trainer.dit_module))
    torch.save(_rng_payload(), tmp / f"rng_state_rank{rank}.pt")
    if rank == 0:
        if trainer.ema is not None:
            ckpt.save_tensors(trainer.ema, tmp / EMA_DIT_FILE)
        if trainer.engine is None:
            torch.save(trainer.optimizer.state_dict(), tmp / "optimizer.pt")
            torch.save(trainer.lr_scheduler.state_dict(), tmp / "scheduler.pt")
        ckpt.write_json(tmp / "sampler_state.json", trainer.sampler.state_dict())
        if trainer.sftaux is not None:
            torch.save(trainer.sftaux.state_dict(), tmp / "sftaux_state.pt")
        ckpt.write_json(tmp / "counters.json", trainer.counters)
        trainer.state.save_to_json(str(tmp / "trainer_state.json"))
        (tmp / "training_args.json").write_text(args.to_json_string())
        cfg_dir = tmp / "configs"
        cfg_dir.mkdir()
        for name, src in trainer.run_configs.items():
            if src and Path(src).is_file():
                shutil.copy2(src, cfg_dir / f"{name}{Path(src).suffix}")
        delay = float(getattr(args, "debug_checkpoint_delay_s", 0.0) or 0.0)
        if delay > 0:  # test hook: widen the window in which a crash leaves a partial checkpoint
            (tmp / "WRITING").write_text("partial")
            time.sleep(delay)
            (tmp / "WRITING").unlink()
    dist.barrier()
    if rank == 0:
        ckpt.finalize(tmp, final, {"global_step": step, "zero_stage": trainer.zero_stage,
                                   "world_size": trainer.world, "has_ema": trainer.ema is not None,
                                   "dit_dtype": "float32"})
        removed = ckpt.rotate(out, args.save_total_limit)
        log.warning("saved %s%s", final, f" (removed {[p.name for p in removed]})" if removed else "")
    dist.barrier()
    return final


def find_resume_checkpoint(output_dir, resume) -> Path | None:
    """``resume``: a path, True/"auto"/None (newest complete checkpoint in output_dir, if any), or False/"no"."""
    if resume in (False, "no", "false", "False"):
        return None
    if resume in (None, True, "auto", "true", "True", ""):
        ckpt.remove_stale_tmp(output_dir) if dist.rank() == 0 else None
        return ckpt.latest_checkpoint(output_dir)
    path = Path(resume)
    if not ckpt.is_complete(path):
        raise FileNotFoundError(f"--resume_from_checkpoint {path}: not a complete checkpoint "
                                f"(needs {ckpt.META}; partial '.tmp' checkpoints are never resumed)")
    return path


def load_training_checkpoint(trainer, path: Path) -> int:
    meta = json.loads((path / ckpt.META).read_text())
    step = int(meta["global_step"])
    rank = trainer.rank
    if trainer.engine is not None:
        if not (path / "deepspeed").is_dir():
            raise ValueError(f"{path} was written without DeepSpeed; resume it without --deepspeed")
        trainer.engine.load_checkpoint(str(path / "deepspeed"), tag=f"global_step{step}",
                                       load_optimizer_states=True, load_lr_scheduler_states=True)
    else:
        if not (path / "optimizer.pt").is_file():
            raise ValueError(f"{path} was written under DeepSpeed; resume it with the same --deepspeed config")
        state = ckpt.load_tensors(path / DIT_FILE)
        dit = trainer.dit_module
        ref = dit.state_dict()
        dit.load_state_dict({k: v.to(ref[k].dtype) for k, v in state.items()})
        trainer.optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=True))
        trainer.lr_scheduler.load_state_dict(torch.load(path / "scheduler.pt", weights_only=True))
    if trainer.ema is not None:
        if not (path / EMA_DIT_FILE).is_file():
            raise ValueError(f"{path} has no EMA weights but --ema_decay > 0")
        trainer.ema = {k: v.float().to(trainer.device) for k, v in ckpt.load_tensors(path / EMA_DIT_FILE).items()}
    rng_file = path / f"rng_state_rank{rank}.pt"
    if rng_file.is_file():
        _restore_rng(torch.load(rng_file, weights_only=True))
    trainer.sampler.load_state_dict(json.loads((path / "sampler_state.json").read_text()))
    if trainer.sftaux is not None and (path / "sftaux_state.pt").is_file():
        trainer.sftaux.load_state_dict(torch.load(path / "sftaux_state.pt", weights_only=True))
    trainer.counters.update(json.loads((path / "counters.json").read_text()))
    trainer.state = TrainerState.load_from_json(str(path / "trainer_state.json"))
    trainer.state.global_step = step
    if rank == 0:
        log.warning("resumed from %s (step %d)", path, step)
    return step
