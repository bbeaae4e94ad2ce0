"""Data-parallel toy build: ``build_ranks`` single-threaded processes train one model on slices of each batch.

Why ranks, not threads (docs/toy_world.md, "A build on both cores; an Intel machine"; ``bench/toy_build_ranks.py``):
on an idle 2-core machine both take ~0.65 of one thread's time (measured 0.680x for two ranks, 0.626x for two
threads), but beside other work OpenMP's threads wait for each other inside every operation, where ranks meet once
per step. A build with ``build_ranks`` > 1 (a key of the build config, so part of its hash):

- draws every batch, noise and caption dropout exactly as the one-process build (the same generators, full-batch
  shapes), and each rank takes its contiguous slice of the batch (``shard``);
- averages the ranks' gradients, and the loss, with one all-reduce per step (``average_grads``) before clipping and
  the optimiser step, so every rank holds the same weights after every step;
- so it trains the one-process build's model up to float rounding (the gradient is summed in another order): a
  different set of weights, deterministic for a given number of ranks (gloo's sum of two ranks is exact-commutative).

``run_build_ranks`` launches the ranks as ``python -m deepgen_rl.toy.build_rank`` with the config as a JSON file
(no pickle), over a ``FileStore`` in the build folder (no port), waits for all of them, stops the rest as soon as one
fails, and returns rank 0's statistics plus the ranks' CPU seconds. Rank 0 writes the model.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

STATS_FILE = ".build_rank0_stats.json"
CONFIG_FILE = ".build_config.json"
STORE_FILE = ".build_store"
# A collective that waits longer than this means a rank hung (a step takes well under a second).
COLLECTIVE_TIMEOUT_S = 600


def build_ranks(cfg: dict[str, Any]) -> int:
    """The config's number of build processes (``build_ranks``, default 1), checked against its batch sizes."""
    n = int(cfg.get("build_ranks", 1))
    if n < 1:
        raise ValueError(f"toy config: build_ranks must be >= 1, got {cfg.get('build_ranks')!r}")
    for key in ("vae_batch", "dit_batch"):
        if n > 1 and int(cfg[key]) % n:
            raise ValueError(f"toy config: {key}={cfg[key]} is not divisible by build_ranks={n}: every rank takes "
                             "an equal slice of each batch")
    return n


def in_rank() -> bool:
    """Whether this process is one rank of a multi-process build (its group is initialised)."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def is_writer() -> bool:
    """Whether this process writes the build's files: rank 0, or the only process."""
    return not in_rank() or dist.get_rank() == 0


def shard(x):
    """This rank's contiguous slice of a full batch (a tensor or a list) along its first dimension."""
    if not in_rank():
        return x
    n, r = dist.get_world_size(), dist.get_rank()
    per = len(x) // n
    return x[r * per:(r + 1) * per]


def average_grads(params: list[torch.nn.Parameter], loss: torch.Tensor) -> float:
    """Average the ranks' gradients of ``params`` (in place) and their losses, in one all-reduce; returns the mean
    loss (this process's own loss outside a multi-process build). Each rank's loss is the mean over its equal
    slice, so the averages are those of the full batch."""
    if not in_rank():
        return loss.item()
    with_grad = [p for p in params if p.grad is not None]
    flat = torch.cat([p.grad.reshape(-1) for p in with_grad] + [loss.detach().reshape(1)])
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    offset = 0
    for p in with_grad:
        n = p.grad.numel()
        p.grad.copy_(flat[offset:offset + n].view_as(p.grad))
        offset += n
    return float(flat[-1])


def child_env(**extra: str) -> dict[str, str]:
    """This process's environment plus ``extra``, with the repository first on ``PYTHONPATH``: what a
    ``python -m deepgen_rl.toy...`` child of the build needs to import this checkout."""
    root = Path(__file__).resolve().parents[2]
    return {**os.environ, **extra,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}


def _children_cpu_s() -> float:
    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    return use.ru_utime + use.ru_stime


def run_build_ranks(out_dir: str, cfg: dict[str, Any], progress: bool) -> dict[str, Any]:
    """Build ``cfg`` into ``out_dir`` in ``build_ranks(cfg)`` processes (module docstring); returns rank 0's
    statistics with ``ranks_cpu_s``, the CPU seconds of all ranks together."""
    n = build_ranks(cfg)
    os.makedirs(out_dir, exist_ok=True)
    cfg_path, store = os.path.join(out_dir, CONFIG_FILE), os.path.join(out_dir, STORE_FILE)
    stats_path = os.path.join(out_dir, STATS_FILE)
    for path in (store, stats_path):
        if os.path.exists(path):
            os.remove(path)
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)
    env = child_env(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")  # one thread per rank (docstring)
    cpu0 = _children_cpu_s()
    procs = []
    try:
        for r in range(n):
            cmd = [sys.executable, "-m", "deepgen_rl.toy.build_rank", "--out", out_dir, "--rank", str(r),
                   "--world", str(n)] + ([] if progress and r == 0 else ["--no_progress"])
            procs.append(subprocess.Popen(cmd, env=env))
        while True:  # until all succeeded or one failed (then the finally stops the others)
            codes = [p.poll() for p in procs]
            failed = next((r for r, c in enumerate(codes) if c not in (None, 0)), None)
            if failed is not None or all(c == 0 for c in codes):
                break
            time.sleep(0.2)
        if failed is not None:
            raise RuntimeError(f"the toy build's rank {failed} of {n} failed with exit status "
                               f"{procs[failed].returncode}; its output is above")
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for path in (cfg_path, store):
            if os.path.exists(path):
                os.remove(path)
    with open(stats_path) as f:
        stats = json.load(f)
    os.remove(stats_path)
    return {**stats, "ranks_cpu_s": round(_children_cpu_s() - cpu0, 1)}
