"""Small torch.distributed helpers that degrade to no-ops in a single process."""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist

from deepgen_rl.utils.build_lock import check_build_locks


def is_dist() -> bool:
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    return dist.get_rank() if is_dist() else int(os.environ.get("RANK", 0))


def world_size() -> int:
    return dist.get_world_size() if is_dist() else int(os.environ.get("WORLD_SIZE", 1))


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", 0))


def local_cuda_index() -> int:
    """This rank's GPU: 0 when the process sees exactly one (``CUDA_VISIBLE_DEVICES`` set per rank, where
    ``LOCAL_RANK`` is not an index of the visible devices), else ``LOCAL_RANK``. Requires CUDA."""
    return 0 if torch.cuda.device_count() == 1 else local_rank()


def init_process_group_if_needed(timeout_s: int = 1800) -> None:
    """Initialise the default group from torchrun's env (nccl with CUDA, gloo on CPU).

    First, local rank 0 clears stale torch JIT-build locks (``utils.build_lock``) that would make DeepSpeed's op
    build wait forever; the other ranks cannot get past the rendezvous before it is done.
    """
    if is_dist():
        return
    if local_rank() == 0:
        check_build_locks()
    if int(os.environ.get("WORLD_SIZE", 1)) <= 1:
        return
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(local_cuda_index())
    dist.init_process_group(backend=backend, timeout=datetime.timedelta(seconds=timeout_s))


def barrier() -> None:
    if is_dist():
        dist.barrier()


def comm_backend() -> str | None:
    """The backend that runs this process's collectives: "nccl" with CUDA, "gloo" on CPU (None outside a group).

    ``torch.distributed.get_backend()`` alone is not enough: a group initialised without a backend (what
    transformers' ``TrainingArguments`` does, through accelerate, under a CPU torchrun, before our own
    initialisation runs) reports "undefined", and a multi-device group "cpu:gloo,cuda:nccl" style names. Then the
    entry for this process's device in ``get_backend_config()`` answers.
    """
    if not is_dist():
        return None
    name = str(dist.get_backend())
    if name != "undefined" and ":" not in name and "," not in name:
        return name
    device = "cuda" if torch.cuda.is_available() else "cpu"
    for entry in str(dist.get_backend_config()).split(","):
        dev, sep, backend = entry.strip().partition(":")
        if sep and dev == device:
            return backend
    raise RuntimeError(f"torch.distributed: no backend for {device} tensors in {dist.get_backend_config()!r}")


def _comm_device() -> torch.device:
    if comm_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_gather_cat(t: torch.Tensor) -> torch.Tensor:
    """Concatenate equally shaped tensors from all ranks along dim 0, in rank order (returns on t's device)."""
    if not is_dist():
        return t
    dev = _comm_device()
    x = t.to(dev).contiguous()
    bool_in = x.dtype == torch.bool
    if bool_in:
        x = x.to(torch.uint8)
    out = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(out, x)
    y = torch.cat(out, 0)
    if bool_in:
        y = y.bool()
    return y.to(t.device)


def all_reduce_mean(values: dict[str, float]) -> dict[str, float]:
    if not is_dist() or not values:
        return values
    keys = sorted(values)
    t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64, device=_comm_device())
    dist.all_reduce(t)
    t /= dist.get_world_size()
    return dict(zip(keys, t.tolist()))


def any_rank(flag: bool) -> bool:
    """True on every rank when ``flag`` is True on at least one (one all-reduce; without a process group: ``flag``).
    For decisions that every rank must take alike, such as leaving the training loop."""
    if not is_dist():
        return bool(flag)
    t = torch.tensor([1.0 if flag else 0.0], device=_comm_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item() > 0)


def all_gather_json(obj) -> list:
    """All-gather a JSON-serialisable object (no pickle): every rank gets [obj_rank0, obj_rank1, ...]."""
    import json

    if not is_dist():
        return [json.loads(json.dumps(obj))]
    dev = _comm_device()
    payload = torch.tensor(list(json.dumps(obj).encode("utf-8")), dtype=torch.uint8, device=dev)
    size = torch.tensor([payload.numel()], dtype=torch.long, device=dev)
    sizes = [torch.zeros_like(size) for _ in range(dist.get_world_size())]
    dist.all_gather(sizes, size)
    longest = int(max(s.item() for s in sizes))
    padded = torch.zeros(longest, dtype=torch.uint8, device=dev)
    padded[: payload.numel()] = payload
    out = [torch.zeros_like(padded) for _ in sizes]
    dist.all_gather(out, padded)
    return [json.loads(bytes(o[: int(s.item())].cpu().tolist()).decode("utf-8")) for o, s in zip(out, sizes)]


def exit_without_teardown(code: int = 0) -> None:
    """End a multi-process gloo worker (a bench or a test's worker script) once its results are out: flush stdout
    and stderr, then ``os._exit`` without interpreter teardown. After ``destroy_process_group``, the teardown of
    DeepSpeed engines' gloo objects at interpreter exit aborts a rank now and then ("terminate called without an
    active exception", SIGABRT): 1 of 40 runs of ``bench/ema_partition.py --smoke`` on a loaded 2-core machine, and
    in CI the EMA bench and ``tests/trainer/ema_worker.py``. Such an abort fails a run whose numbers were all out."""
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
