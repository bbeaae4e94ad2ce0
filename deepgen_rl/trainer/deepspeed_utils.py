"""DeepSpeed glue: resolve a shipped JSON config's "auto" values from the training arguments."""

from __future__ import annotations

import copy
import json
from contextlib import contextmanager, nullcontext
from pathlib import Path


def _no_shm_op():
    return None


def skip_cpu_shm_comm_op() -> bool:
    """Keep DeepSpeed from compiling its shared-memory comm op on a machine without CUDA; True where it did so.

    Every process that starts DeepSpeed (``deepspeed.init_distributed``, ``deepspeed.initialize``) creates DeepSpeed
    0.19.6's ``TorchBackend``, which on the CPU accelerator JIT-compiles ``deepspeed_shm_comm`` (C++, ~65 s and ~130
    CPU-s on a 2-core machine the first time; then cached in ``TORCH_EXTENSIONS_DIR``, while other processes wait for
    the compile) and only initialises it: its collectives all go through torch.distributed (gloo on CPU). This makes
    the backend's op builder return nothing, as on a platform without the op. Call it before the process's first
    DeepSpeed process group or engine. ``tests/trainer/test_deepspeed_shm.py`` checks that the installed DeepSpeed's
    backend uses the op nowhere but in its constructor, so a DeepSpeed that starts to use it fails that test."""
    import torch

    if torch.cuda.is_available():
        return False
    import importlib

    # importlib, not ``import deepspeed.comm.torch as m``: that binds the attribute ``torch`` of deepspeed.comm,
    # which is the torch package
    importlib.import_module("deepspeed.comm.torch").build_shm_op = _no_shm_op
    return True


def init_deepspeed_distributed(dist_backend: str) -> None:
    """``deepspeed.init_distributed(dist_backend=...)`` after ``skip_cpu_shm_comm_op`` (for processes that start
    DeepSpeed's process group themselves: the test workers and benches)."""
    skip_cpu_shm_comm_op()
    import deepspeed

    deepspeed.init_distributed(dist_backend=dist_backend)


def build_deepspeed_config(config, args, world_size: int, hidden_size: int | None = None, *,
                           gloo: bool = False) -> dict:
    """Load ``config`` (path or dict) and fill every "auto" from ``args``.

    ``hidden_size`` (the DiT's width, heads × head_dim) sets ``stage3_param_persistence_threshold: "auto"`` to
    10·hidden_size (the convention of transformers' DeepSpeed integration): weight matrices are partitioned, only
    bias/norm vectors stay replicated. Without it the threshold is 1e5 elements.

    The GRPO trainer drives gradient accumulation itself (``set_gradient_accumulation_boundary``), so DeepSpeed
    sees micro-batch 1, accumulation 1 and ``train_batch_size = world_size``; the loss is already a mean over the
    whole rollout batch when it reaches ``engine.backward``. Gradient clipping = ``--max_grad_norm``; bf16/fp16
    follow ``--bf16`` / ``--fp16``. The optimizer and LR scheduler come from the HF trainer (``--learning_rate``,
    ``--lr_scheduler_type`` ...) unless the JSON defines its own.

    ``gloo`` (the process group runs on gloo, i.e. CPU): ZeRO-3 gathers parameters one at a time
    (``stage3_allgather_sequential``). DeepSpeed 0.19.6's coalesced gather starts one async all-gather per parameter
    and waits only for the last handle; gloo runs them on a thread pool in no set order, so a parameter could be read
    before its data arrived (seen: one rank's gathered weights were uninitialised memory). NCCL orders them on one
    stream, so GPU runs keep the coalesced gather. A value the JSON sets itself is kept. The trainer decides ``gloo``
    with ``deepgen_rl.utils.dist.comm_backend()``: on a CPU torchrun the group comes from ``TrainingArguments``
    without a named backend, and ``torch.distributed.get_backend()`` says "undefined" there.
    """
    if isinstance(config, (str, Path)):
        path = Path(config)
        if not path.is_file():
            raise FileNotFoundError(f"DeepSpeed config not found: {path}")
        cfg = json.loads(path.read_text())
    else:
        cfg = copy.deepcopy(dict(config))
    cfg["train_micro_batch_size_per_gpu"] = 1
    cfg["gradient_accumulation_steps"] = 1
    cfg["train_batch_size"] = world_size
    if cfg.get("gradient_clipping", "auto") == "auto":
        cfg["gradient_clipping"] = float(args.max_grad_norm or 0.0)
    for key, flag in (("bf16", bool(args.bf16)), ("fp16", bool(args.fp16))):
        section = cfg.setdefault(key, {})
        if section.get("enabled", "auto") == "auto":
            section["enabled"] = flag
    zero = cfg.get("zero_optimization", {})
    if gloo and int(zero.get("stage", 0)) == 3:
        zero.setdefault("stage3_allgather_sequential", True)
    cfg["zero_allow_untested_optimizer"] = True
    cfg.setdefault("steps_per_print", 10**9)
    cfg.setdefault("wall_clock_breakdown", False)

    def resolve(node):
        if isinstance(node, dict):
            for k, v in list(node.items()):
                if v == "auto":
                    node[k] = _auto_value(k, args, hidden_size)
                else:
                    resolve(v)

    resolve(cfg)
    return cfg


def _auto_value(key: str, args, hidden_size: int | None = None):
    table = {"lr": args.learning_rate, "weight_decay": args.weight_decay,
             "betas": [args.adam_beta1, args.adam_beta2], "eps": args.adam_epsilon,
             "warmup_max_lr": args.learning_rate, "warmup_min_lr": 0.0}
    if key in table:
        return table[key]
    if key in ("reduce_bucket_size", "stage3_prefetch_bucket_size"):
        return int(5e7)
    if key == "stage3_param_persistence_threshold":
        return int(10 * hidden_size) if hidden_size else int(1e5)
    raise ValueError(f"DeepSpeed config: no rule to resolve \"auto\" for {key!r}; set a value")


@contextmanager
def gathered_params(module, zero_stage: int):
    """Full parameters of ``module`` inside the block (ZeRO-3 gathers them; other stages already have them)."""
    if zero_stage == 3:
        import deepspeed

        ctx = deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=None)
    else:
        ctx = nullcontext()
    with ctx:
        yield


def dit_hidden_size(dit) -> int | None:
    """The DiT's width (``num_attention_heads · attention_head_dim`` of a diffusers SD3 config); None if unknown."""
    cfg = getattr(dit, "config", None)
    heads, head_dim = getattr(cfg, "num_attention_heads", None), getattr(cfg, "attention_head_dim", None)
    return int(heads) * int(head_dim) if heads and head_dim else None


def partitioned_fraction(module) -> tuple[int, int]:
    """(parameters whose data ZeRO-3 has partitioned away on this rank, all parameters) of ``module``.

    A ZeRO-3 parameter carries ``ds_tensor`` (this rank's shard, ``ds_numel`` = full size); a partitioned one holds
    an empty ``data`` outside a forward. Parameters below the persistence threshold stay whole (``ds_persist``).
    """
    params = list(module.parameters())
    parted = sum(1 for p in params if hasattr(p, "ds_tensor") and not getattr(p, "ds_persist", False)
                 and p.data.numel() == 0 and p.ds_tensor.numel() < p.ds_numel)
    return parted, len(params)


def _nvcc_release(nvcc: Path) -> str | None:
    """``"12.4"`` from ``nvcc --version`` ("... release 12.4, V12.4.131"); None if it cannot be run."""
    import re
    import subprocess

    try:
        out = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"release (\d+\.\d+)", out)
    return m.group(1) if m else None


def cpu_adam_problem(ds_config: dict) -> str | None:
    """One line naming what is missing to build DeepSpeed's CPU Adam on a GPU node, or None when nothing is.

    Only a config that offloads the optimizer (``zero_optimization.offload_optimizer.device`` "cpu"/"nvme") on a
    CUDA machine needs it, and only when DeepSpeed was installed without the op prebuilt: it is then JIT-compiled on
    first use, which needs ``CUDA_HOME`` (or nvcc on PATH), ``$CUDA_HOME/bin/nvcc`` of the same major CUDA version as
    torch, and ninja. (On a CPU-only machine DeepSpeed builds the op with the host compiler alone.)
    """
    import torch

    offload = (ds_config.get("zero_optimization") or {}).get("offload_optimizer") or {}
    if offload.get("device") not in ("cpu", "nvme") or not torch.cuda.is_available():
        return None
    try:
        from deepspeed.git_version_info import installed_ops

        if installed_ops.get("cpu_adam"):
            return None
    except ImportError:
        pass
    from torch.utils import cpp_extension

    fix = "or install deepspeed with the op prebuilt (DS_BUILD_CPU_ADAM=1 pip install deepspeed)"
    home = cpp_extension.CUDA_HOME
    if not home:
        return (f"offload_optimizer needs DeepSpeed's CPU Adam, built against CUDA {torch.version.cuda}, but "
                f"CUDA_HOME is unset and no nvcc is on PATH: install that CUDA toolkit and export CUDA_HOME, {fix}")
    nvcc = Path(home) / "bin" / "nvcc"
    if not nvcc.is_file():
        return f"offload_optimizer needs DeepSpeed's CPU Adam: {nvcc} not found (CUDA_HOME={home}); {fix}"
    release = _nvcc_release(nvcc)
    want = str(torch.version.cuda or "")
    if release is None or release.split(".")[0] != want.split(".")[0]:
        return (f"offload_optimizer needs DeepSpeed's CPU Adam: {nvcc} is CUDA {release or 'unknown'}, torch was "
                f"built with CUDA {want}: point CUDA_HOME to a CUDA {want} toolkit, {fix}")
    if not cpp_extension.is_ninja_available():
        return f"offload_optimizer needs DeepSpeed's CPU Adam, JIT-built with ninja: pip install ninja, {fix}"
    return None


def fp32_master_params(module, engine):
    """Yield ``(name, full fp32 tensor)`` of the optimizer's MASTER weights for every parameter of ``module``.

    Under DeepSpeed's bf16/fp16 mode the module holds low-precision copies; the fp32 masters live, partitioned, in
    the ZeRO optimizer (``deepspeed.utils.safe_get_full_fp32_param`` assembles one parameter: a collective, so every
    rank must iterate in the same order). Without an engine, or where DeepSpeed keeps no separate master, the
    parameter itself (gathered under ZeRO-3) is the master. One parameter at a time: no second full model copy.
    """
    import torch

    for name, p in module.named_parameters():
        full = None
        if engine is not None:
            from deepspeed.utils import safe_get_full_fp32_param

            full = safe_get_full_fp32_param(p)
        if full is None:
            with gathered_params_of([p], hasattr(p, "ds_id")):
                full = p.detach().to(torch.float32, copy=True)
        yield name, full.detach().float()


def fp32_master_state_dict(module, engine) -> dict:
    """``module.state_dict()`` keys as fp32 CPU tensors, parameters from the MASTER weights
    (:func:`fp32_master_params`), buffers (e.g. positional tables) as they are; call on every rank."""
    import torch

    out = {n: t.to("cpu", copy=True) for n, t in fp32_master_params(module, engine)}
    for name, buf in module.named_buffers():
        if name in out:
            continue
        out[name] = buf.detach().to("cpu", torch.float32, copy=True)
    keys = set(module.state_dict().keys())  # persistent buffers only, in the module's own key set
    return {k: v for k, v in out.items() if k in keys}


@contextmanager
def gathered_params_of(params, partitioned: bool):
    if partitioned:
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(params), modifier_rank=None):
            yield
    else:
        yield


def dit_from_state(template, state: dict, *, device, dtype, copy: bool = True):
    """A plain, frozen copy of ``template``'s architecture holding ``state`` (name -> tensor), in ``dtype``.

    Built on the meta device from ``template.config`` (no random fp32 initialisation, no host copy of the full
    model) and filled with ``load_state_dict(assign=True)``, each tensor converted on its own to ``dtype`` on
    ``device``: the peak is one ``dtype`` copy. Keys of ``template.state_dict()`` missing from ``state`` (buffers such
    as positional tables) come from ``template``; ``template`` may be ZeRO-3-partitioned (only its buffers are read).
    ``copy=False`` lets a tensor already in ``dtype`` on ``device`` be shared, not copied (read-only uses).
    """
    import torch

    with torch.device("meta"):
        module = type(template).from_config(template.config)
    wanted = set(module.state_dict())
    buffers = dict(template.named_buffers())
    full = {}
    for key in wanted:
        src = state.get(key)
        if src is None:
            src = buffers.get(key)
        if src is None:
            raise RuntimeError(f"no weights for {key!r} (the state has {len(state)} tensors)")
        full[key] = src.detach().to(device=device, dtype=dtype if src.is_floating_point() else src.dtype, copy=copy)
    module.load_state_dict(full, assign=True, strict=True)
    for name, buf in list(module.named_buffers()):  # non-persistent buffers are not in state_dict: rebuild them
        if buf.is_meta:
            owner, _, leaf = name.rpartition(".")
            mod = module.get_submodule(owner) if owner else module
            mod.register_buffer(leaf, buffers[name].detach().to(device=device, dtype=dtype), persistent=False)
    return module.eval().requires_grad_(False)
