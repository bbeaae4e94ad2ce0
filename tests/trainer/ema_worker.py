"""torchrun worker (2 gloo processes) for tests/trainer/test_partitioned_ema.py; rank 0 prints one JSON line.

For each case the same small module (odd-sized tensors, so ZeRO-2's flat partitions split parameters between the
ranks) takes 3 AdamW steps on rank-dependent inputs; a :class:`PartitionedEMA` (decay 0.6) is updated after each.
The test's own reference is the closed form ``ref_0 = θ_0, ref_t = d·ref_{t-1} + (1−d)·θ_t`` of the full fp32
masters read after each step with ``deepspeed.utils.safe_get_full_fp32_param`` (without DeepSpeed: the parameters).
Cases: ``none`` (no DeepSpeed, gradients all-reduced by hand), ``zero2`` / ``zero2_bf16`` (scripts/deepspeed/zero2.json)
``zero3`` (zero3.json as shipped: this module's tensors are all below the persistence threshold, so the module keeps
them whole while their fp32 masters are partitioned) and ``zero3_all`` / ``zero3_all_bf16`` (zero3.json with
persistence threshold 0: every parameter partitioned).
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from deepgen_rl.trainer.deepspeed_utils import (build_deepspeed_config, init_deepspeed_distributed,  # noqa: E402
                                                partitioned_fraction)
from deepgen_rl.trainer.ema import PartitionedEMA  # noqa: E402
from tests.trainer.helpers import ROOT  # noqa: E402

DS = ROOT / "scripts/deepspeed"
DECAY, STEPS, LR = 0.6, 3, 1e-2


class Args:  # what build_deepspeed_config reads
    max_grad_norm, learning_rate, weight_decay = 0.0, LR, 0.0
    adam_beta1, adam_beta2, adam_epsilon, fp16 = 0.9, 0.999, 1e-8, False

    def __init__(self, bf16: bool):
        self.bf16 = bf16


def small_module() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(7, 13), torch.nn.GELU(), torch.nn.Linear(13, 5), torch.nn.LayerNorm(5),
                               torch.nn.Linear(5, 1))  # a 1-element bias: ZeRO-3's rank 1 holds only padding of it


def ds_config(case: str) -> dict:
    base = case.removesuffix("_bf16")
    cfg = json.loads((DS / ("zero2.json" if base == "zero2" else "zero3.json")).read_text())
    if base == "zero3_all":
        cfg["zero_optimization"].update({"stage3_param_persistence_threshold": 0, "reduce_bucket_size": 1000,
                                         "stage3_prefetch_bucket_size": 1000})
    return build_deepspeed_config(cfg, Args(case.endswith("_bf16")), torch.distributed.get_world_size(), gloo=True)


def full_masters(module, engine) -> dict:
    if engine is None:
        return {n: p.detach().float().clone() for n, p in module.named_parameters()}
    from deepspeed.utils import safe_get_full_fp32_param

    return {n: safe_get_full_fp32_param(p).detach().float().clone() for n, p in module.named_parameters()}


def run_case(case: str, out: Path) -> dict:
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    module = small_module()
    opt = torch.optim.AdamW(module.parameters(), lr=LR, weight_decay=0.0)
    engine = None
    if case != "none":
        import deepspeed

        engine, opt, _, _ = deepspeed.initialize(model=module, optimizer=opt, config=ds_config(case),
                                                 dist_init_required=False)
    res: dict = {}
    if case.startswith("zero3"):
        res["partitioned"] = partitioned_fraction(module)
    ema = PartitionedEMA(module, engine)
    ref = full_masters(module, engine)
    # the fragments this rank holds, assembled, are the masters DeepSpeed assembles itself (the mapping is right)
    res["init_diff"] = max(float((ema.full_state_dict()[n] - ref[n]).abs().max()) for n in ref)
    dtype = torch.bfloat16 if case.endswith("_bf16") else torch.float32
    for step in range(STEPS):
        g = torch.Generator().manual_seed(100 * step + rank)
        x = torch.randn(4, 7, generator=g).to(dtype)
        model = engine if engine is not None else module
        loss = model(x).float().pow(2).mean() + 0.1 * model(x).float().sum()
        if engine is not None:
            engine.backward(loss)
            engine.step()
        else:
            loss.backward()
            for p in module.parameters():
                torch.distributed.all_reduce(p.grad)
                p.grad /= world
            opt.step()
            opt.zero_grad(set_to_none=True)
        ema.update(DECAY)
        masters = full_masters(module, engine)
        ref = {n: DECAY * ref[n] + (1 - DECAY) * masters[n] for n in ref}
    full = ema.full_state_dict()
    res["ema_vs_closed_form"] = max(float((full[n] - ref[n]).abs().max()) for n in ref)
    res["ema_vs_masters"] = max(float((full[n] - masters[n]).abs().max()) for n in ref)  # the EMA lags: > 0
    res["ema"] = {n: t.reshape(-1).tolist() for n, t in full.items()}
    res["shapes_ok"] = all(tuple(full[n].shape) == tuple(p.ds_shape if hasattr(p, "ds_shape") else p.shape)
                           for n, p in module.named_parameters())
    if engine is not None and dtype == torch.bfloat16:  # the module holds bf16 copies; the EMA follows the masters
        from deepgen_rl.trainer.deepspeed_utils import gathered_params

        with gathered_params(module, 3 if case.startswith("zero3") else 0):
            live = {n: p.detach().float().clone() for n, p in module.named_parameters()}
        res["masters_vs_bf16_module"] = max(float((masters[n] - live[n]).abs().max()) for n in live)
    sizes = [None] * world
    torch.distributed.all_gather_object(sizes, [ema.numel_local(), ema.numel_full()])
    res["numel_local"], res["numel_full"] = [s[0] for s in sizes], sizes[0][1]
    res["split_params"] = sum(0 < n < full_n for _, n, full_n in ema.layout().values())  # partial on this rank
    # rank-0-only gather: the others hold no full copy
    only0 = ema.full_state_dict(rank=0)
    kept = [None] * world
    torch.distributed.all_gather_object(kept, len(only0))
    res["rank0_only_lengths"] = kept
    res["rank0_only_equal"] = rank != 0 or all(torch.equal(only0[n], full[n]) for n in full)
    # resume: a fresh EMA (initialised from the current masters) loads the full tensors and re-slices them
    path = out / f"{case}_ema.safetensors"
    if rank == 0:
        from safetensors.torch import save_file

        save_file({n: t.contiguous() for n, t in full.items()}, str(path))
    torch.distributed.barrier()
    from safetensors.torch import load_file

    fresh = PartitionedEMA(module, engine)
    res["fresh_differs"] = any(not torch.equal(t, full[n]) for n, t in fresh.full_state_dict().items())
    fresh.load_full_state_dict(load_file(str(path)))
    back = fresh.full_state_dict()
    res["resume_max_diff"] = max(float((back[n] - full[n]).abs().max()) for n in full)
    ema.update(DECAY)
    fresh.update(DECAY)
    a, b = ema.full_state_dict(), fresh.full_state_dict()
    res["resume_next_update_diff"] = max(float((a[n] - b[n]).abs().max()) for n in a)
    return res


def main():
    torch.distributed.init_process_group("gloo")
    init_deepspeed_distributed("gloo")
    box = [tempfile.mkdtemp(prefix="ema_worker_") if torch.distributed.get_rank() == 0 else None]
    torch.distributed.broadcast_object_list(box, src=0)  # one folder for both ranks
    out = Path(box[0])
    report = {case: run_case(case, out) for case in sys.argv[1].split(",")}
    if torch.distributed.get_rank() == 0:
        print("EMA_REPORT " + json.dumps(report), flush=True)
    torch.distributed.barrier()
    if torch.distributed.get_rank() == 0:  # the ranks' shared scratch folder (the exit below skips atexit)
        shutil.rmtree(out, ignore_errors=True)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
    from deepgen_rl.utils.dist import exit_without_teardown

    exit_without_teardown()  # results are out: no interpreter teardown (its gloo abort, deepgen_rl.utils.dist)
