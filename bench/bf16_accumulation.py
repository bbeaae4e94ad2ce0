"""Gradient error of DeepSpeed's bf16 mode after one update's ~30 accumulated backwards, through the trainer's real
ZeRO-2 path (``scripts/deepspeed/zero2.json``), on the CPU with gloo processes and the tiny model.

One GRPO update of ``DeepGenGRPOTrainer`` (rollout, rewards, advantages, ``--num-inference-steps`` x
``--timestep-fraction`` policy pieces of one micro-batch, then the SFT term λ = ``--sft-coef`` as the last
backward, exactly as train.sh's default) is run three times from the same weights, prompts and noise:

  fp32         DeepSpeed ZeRO-2 without bf16 (fp32 module, fp32 gradients): the reference gradient g32
  bf16         DeepSpeed ZeRO-2 bf16 mode (bf16 module, DeepSpeed's bf16 gradient accumulation): g_bf16
  bf16 λ·0     bf16 with the SFT loss multiplied by 0 (same backwards, the SFT term contributes nothing)

The accumulated gradient is read just before the optimizer step (``deepspeed.utils.safe_get_full_grad``, as
tests/trainer/test_zero_gradients.py does). A tensor hook on every DiT parameter also records each backward's own
gradient (bf16 in bf16 mode), summed in float64 and averaged over the ranks: the exact sum of the very pieces
DeepSpeed accumulated. Printed, as relative L2 errors over all DiT parameters:

  accumulation  ||g_bf16 − Σ pieces|| / ||Σ pieces||       what bf16 accumulation/reduction alone adds
  end to end    ||g_bf16 − g32|| / ||g32||                  bf16 forwards + backwards + accumulation
  SFT term      kept = <g_bf16 − g_bf16(λ·0), p_sft> / ||p_sft||², p_sft the SFT backward's own gradient

Runs itself under ``torch.distributed.run --nproc_per_node --nproc`` when started with plain ``python``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DEMO_PROGRAMMATIC, ROOT, TINY_CONFIG, load_note, print_ratio, print_rerun, print_table, \
    run_under_torchrun, setup_env  # noqa: E402

SFT_DEMO = str(ROOT / "assets/sftaux/demo.py")
ZERO2 = str(ROOT / "scripts/deepspeed/zero2.json")


def grpo_config(opts, output_dir: str):
    from transformers import HfArgumentParser

    from deepgen_rl.config import GRPOConfig

    values = {
        "output_dir": output_dir, "rollout_n": 4, "rollout_micro_batch_size": opts.images,
        "atrain_micro_batch_size": opts.images, "num_inference_steps": opts.num_inference_steps,
        "timestep_fraction": opts.timestep_fraction, "image_height": 32, "image_width": 32, "max_steps": 1,
        "save_steps": 100000, "log_images_every": 0, "report_to": "none", "sftaux_coef": opts.sft_coef,
        "sftaux_micro_batch_size": 2, "beta": 0.0, "disable_tqdm": True, "learning_rate": 1e-5, "seed": 1,
        "eval_freq": 0, "auto_resume": False, "warmup_steps": 0, "sde_eta": 0.7,
    }
    argv = [x for k, v in values.items() for x in (f"--{k}", str(v))]
    (cfg,) = HfArgumentParser((GRPOConfig,)).parse_args_into_dataclasses(args=argv)
    cfg.deepspeed_config = ZERO2
    return cfg


def one_update(opts, name: str, *, bf16: bool, sft_zero: bool, out: Path) -> dict:
    """Run one update; return the accumulated gradient, the exact sum of its pieces and the SFT piece (flat fp64)."""
    import torch
    from deepspeed.utils import safe_get_full_grad

    from deepgen_rl.models import build_model
    from deepgen_rl.trainer.grpo_trainer import DeepGenGRPOTrainer
    from deepgen_rl.utils import dist

    args = grpo_config(opts, str(out / name))
    args.bf16 = bf16  # set after parsing: HF refuses --bf16 on a CPU-only machine; DeepSpeed's CPU path takes it
    trainer = DeepGenGRPOTrainer(build_model(TINY_CONFIG, tiny_preset=opts.preset), args,
                                 dataset_config=DEMO_PROGRAMMATIC, sftaux_dataset_config=SFT_DEMO)
    trainer._setup_optimization(1)
    trainer.state.global_step = 0
    trainer._executor = ThreadPoolExecutor(max_workers=1)
    params = list(trainer.dit_module.named_parameters())
    pieces = {"sum": {n: torch.zeros(p.numel(), dtype=torch.float64) for n, p in params}, "last": {}, "count": 0}

    def hook(n):
        def record(g):  # this backward's own gradient of parameter n, in the module's dtype
            flat = g.detach().double().reshape(-1)
            pieces["sum"][n] += flat
            pieces["last"][n] = flat.clone()
        return record

    handles = [p.register_hook(hook(n)) for n, p in params]
    backward = trainer._backward

    def counted_backward(loss, *, is_last):
        pieces["count"] += 1
        return backward(loss, is_last=is_last)

    trainer._backward = counted_backward
    if sft_zero:
        sft_loss = trainer.sftaux.loss

        def zero_sft(*a, **k):
            loss, stats = sft_loss(*a, **k)
            return loss * 0.0, stats

        trainer.sftaux.loss = zero_sft
    result: dict = {}
    step = trainer._optimizer_step

    def capture(skip: bool):
        result["grad"] = torch.cat([safe_get_full_grad(p).detach().double().reshape(-1) for _, p in params])
        return step(skip)

    trainer._optimizer_step = capture
    try:
        metrics = trainer.grpo_step(0)
    finally:
        trainer._executor.shutdown(wait=True)
        for h in handles:
            h.remove()
    exact = torch.cat([pieces["sum"][n] for n, _ in params])
    last = torch.cat([pieces["last"][n] for n, _ in params])
    if dist.is_dist():  # DeepSpeed averages the ranks' gradients
        for t in (exact, last):
            torch.distributed.all_reduce(t)
            t /= dist.world_size()
    result.update(exact=exact, sft_piece=last, backwards=pieces["count"], module_dtype=str(params[0][1].dtype),
                  nonfinite=metrics["train/nonfinite_losses"])
    return result


def worker(opts) -> None:
    import torch

    from deepgen_rl.utils.dist import exit_without_teardown

    torch.distributed.init_process_group("gloo")
    from deepgen_rl.trainer.deepspeed_utils import init_deepspeed_distributed

    init_deepspeed_distributed("gloo")
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    out = Path(tempfile.mkdtemp(prefix="bf16_accum_"))
    runs = {
        "fp32": one_update(opts, "fp32", bf16=False, sft_zero=False, out=out),
        "bf16": one_update(opts, "bf16", bf16=True, sft_zero=False, out=out),
        "bf16_sft0": one_update(opts, "bf16_sft0", bf16=True, sft_zero=True, out=out),
    }
    torch.distributed.barrier()
    shutil.rmtree(out, ignore_errors=True)  # this rank's scratch folder (exit_without_teardown skips atexit)
    if rank != 0:
        torch.distributed.destroy_process_group()
        exit_without_teardown()

    def rel(a, b):
        return float((a - b).norm() / b.norm())

    g32, gbf, gbf0 = runs["fp32"]["grad"], runs["bf16"]["grad"], runs["bf16_sft0"]["grad"]
    p_sft = runs["bf16"]["sft_piece"]
    kept = float(((gbf - gbf0) @ p_sft) / (p_sft @ p_sft))
    report = {
        "world": world, "backwards": runs["bf16"]["backwards"], "params": int(g32.numel()),
        "module_dtype": {k: r["module_dtype"] for k, r in runs.items()},
        "fp32_accumulation": rel(g32, runs["fp32"]["exact"]), "bf16_accumulation": rel(gbf, runs["bf16"]["exact"]),
        "bf16_end_to_end": rel(gbf, g32), "sft_kept": kept, "sft_rel_error": rel(gbf - gbf0, p_sft),
        "sft_piece_rel_norm": float(p_sft.norm() / runs["bf16"]["exact"].norm()),
        "nonfinite": {k: r["nonfinite"] for k, r in runs.items()},
    }
    n = report["backwards"]
    print(f"{world} gloo process(es), tiny DiT preset {opts.preset!r} ({report['params']} parameters), one update of "
          f"{n} backwards ({n - 1} policy pieces + the SFT term, λ = {opts.sft_coef}), ZeRO-2 (zero2.json); "
          f"{load_note()}")
    print_table("relative L2 gradient error over all DiT parameters (rank 0)", ["comparison", "value"], [
        ["fp32 accumulation: ||g32 - sum(pieces)|| / ||sum(pieces)||", report["fp32_accumulation"]],
        ["bf16 accumulation: ||g_bf16 - sum(bf16 pieces)|| / ||sum||", report["bf16_accumulation"]],
        ["bf16 end to end: ||g_bf16 - g32|| / ||g32||", report["bf16_end_to_end"]],
        ["SFT term: ||p_sft|| / ||sum(pieces)||", report["sft_piece_rel_norm"]],
        ["SFT term kept by the bf16 accumulator: <dg, p_sft> / ||p_sft||^2", report["sft_kept"]],
        ["SFT term error: ||dg - p_sft|| / ||p_sft||", report["sft_rel_error"]],
    ], ["", ".3e"])
    print_ratio("bf16_accumulation_error (relative L2)", report["bf16_accumulation"])
    print_ratio("bf16_end_to_end_error (relative L2)", report["bf16_end_to_end"])
    print_ratio("sft_term_kept bf16 (fraction of lambda*g_sft)", report["sft_kept"])
    print("BF16_ACCUM_REPORT " + json.dumps(report), flush=True)
    print_rerun(__file__, threads=1)
    torch.distributed.destroy_process_group()
    exit_without_teardown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=2, help="gloo processes (ranks)")
    parser.add_argument("--preset", default="tiny", help="tiny model preset (deepgen_rl.models.tiny)")
    parser.add_argument("--images", type=int, default=8, help="images per rank (one training micro-batch)")
    parser.add_argument("--num-inference-steps", type=int, default=50)
    parser.add_argument("--timestep-fraction", type=float, default=0.6, help="0.6 x 50 = 30 pieces: the recipe's")
    parser.add_argument("--sft-coef", type=float, default=1e-4, help="λ of the SFT term (the recipe's 1e-4)")
    parser.add_argument("--smoke", action="store_true", help="1 process, 5 steps (3 pieces): seconds")
    opts = parser.parse_args()
    if opts.smoke:
        opts.nproc, opts.num_inference_steps, opts.images = 1, 5, 4
    setup_env(1)
    if "RANK" not in os.environ:  # start the processes
        run_under_torchrun(__file__, opts.nproc)
    worker(opts)


if __name__ == "__main__":
    main()
