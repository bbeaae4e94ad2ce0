"""torchrun worker (2 gloo processes): the gradient ONE GRPO update accumulates, under every DeepSpeed config, next to
the no-DeepSpeed run's (the reference). Run by tests/trainer/test_zero_gradients.py; rank 0 prints one JSON line.

For each config the same tiny model, rollout, rewards and SFT batches are used; the trainer's ``_optimizer_step`` is
wrapped to read the full accumulated gradient just before the step (``deepspeed.utils.safe_get_full_grad``, which
assembles ZeRO partitions; the reference all-reduces and averages ``p.grad`` itself). ``zero3_all`` is zero3.json with
every parameter partitioned (persistence threshold 0, small buckets). Cases ending in ``_nan_last`` poison the LAST
policy piece of the update (and turn the SFT term off), so the update ends with the trainer's zero-loss boundary
backward. ``zero2_skip`` makes DeepSpeed report its step as not applied (as on an overflow);
``*_bf16`` runs DeepSpeed's bf16 mode (bf16 module, fp32 masters in the optimizer). Cases ending in ``_zeroadv`` set
the advantages of all but the first image of rank 0 and all but the first three of rank 1 to 0 (unequal counts, so
rank 0 must pad); ``_skipadv`` does the same with ``--skip_zero_advantage`` on; their reference is ``none_zeroadv``.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from deepgen_rl.trainer import grpo_trainer, policy  # noqa: E402
from deepgen_rl.trainer.deepspeed_utils import (fp32_master_state_dict, gathered_params,  # noqa: E402
                                                 partitioned_fraction)
from deepgen_rl.utils import dist  # noqa: E402
from tests.trainer.helpers import DEMO_PROGRAMMATIC, ROOT, make_args, tiny_model  # noqa: E402

DS = ROOT / "scripts/deepspeed"
SFT_DEMO = str(ROOT / "assets/sftaux/demo.py")


def zero3_all() -> dict:
    cfg = json.loads((DS / "zero3.json").read_text())
    cfg["zero_optimization"].update({"stage3_param_persistence_threshold": 0, "reduce_bucket_size": 1000,
                                     "stage3_prefetch_bucket_size": 1000})
    return cfg


def zeroed_advantages(orig):
    """compute_advantages with A = 0 except for global images 0 (rank 0) and n, n+1, n+2 (rank 1)."""
    def wrapped(*a, **k):
        out = orig(*a, **k)
        n = out.advantages.numel() // dist.world_size()
        keep = torch.zeros_like(out.advantages, dtype=torch.bool)
        keep[0] = True
        keep[n:n + 3] = True
        out.advantages = torch.where(keep, out.advantages, torch.zeros_like(out.advantages))
        return out
    return wrapped


def one_update(name: str, ds_config, out: Path, *, nan_last: bool, skip: bool = False, bf16: bool = False,
               zero_adv: bool = False, skip_adv: bool = False) -> dict:
    overrides = dict(max_steps=1, atrain_micro_batch_size=4, learning_rate=1e-3, ema_decay=0.5 if skip else 0.0,
                     skip_zero_advantage=skip_adv)
    if not nan_last:  # the SFT term (λ = 0.5) is the LAST backward of the update
        overrides.update(sftaux_coef=0.5, sftaux_micro_batch_size=2)
    args = make_args(out / name, **overrides)
    args.deepspeed_config = ds_config or None  # a path or a dict (build_deepspeed_config reads both)
    args.bf16 = bf16  # set after parsing: HF refuses --bf16 on a CPU-only machine; DeepSpeed's CPU path takes it
    trainer = grpo_trainer.DeepGenGRPOTrainer(tiny_model(), args, dataset_config=DEMO_PROGRAMMATIC,
                                              sftaux_dataset_config=None if nan_last else SFT_DEMO)
    trainer._setup_optimization(1)
    if skip:  # DeepSpeed reports the step as skipped (what an fp16/bf16 overflow does)
        trainer.engine.was_step_applied = lambda: False
        ema0 = trainer.ema.full_state_dict()
    trainer.state.global_step = 0
    trainer._executor = ThreadPoolExecutor(max_workers=1)
    result: dict = {}
    step = trainer._optimizer_step

    def capture(skip: bool):
        grads = {}
        for n, p in trainer.dit_module.named_parameters():
            if trainer.engine is not None:
                from deepspeed.utils import safe_get_full_grad

                g = safe_get_full_grad(p).detach().float().clone()
            else:
                g = p.grad.detach().float().clone()
                torch.distributed.all_reduce(g)
                g /= dist.world_size()
            grads[n] = g.reshape(-1)
        result["grads"] = grads
        if trainer.zero_stage == 3:
            result["partitioned"] = partitioned_fraction(trainer.dit_module)
        return step(skip)

    trainer._optimizer_step = capture
    orig_piece = policy.policy_piece_loss
    pieces = {"n": 0}

    def piece(tr, batch, advantages, mb, j):
        loss, stats = orig_piece(tr, batch, advantages, mb, j)
        pieces["n"] += 1
        if nan_last and pieces["n"] == pieces["total"]:
            loss = loss * float("nan")
        return loss, stats

    n_images = trainer.layout["images_per_rank"]
    n_trained = max(1, round(args.timestep_fraction * args.num_inference_steps))
    pieces["total"] = -(-n_images // args.atrain_micro_batch_size) * n_trained
    grpo_trainer.policy_piece_loss = piece
    orig_adv = grpo_trainer.compute_advantages
    if zero_adv or skip_adv:
        grpo_trainer.compute_advantages = zeroed_advantages(orig_adv)
    try:
        metrics = trainer.grpo_step(0)
    finally:
        grpo_trainer.policy_piece_loss = orig_piece
        grpo_trainer.compute_advantages = orig_adv
        trainer._executor.shutdown(wait=True)
    result["grad_norm"] = metrics["train/grad_norm"]
    result["nonfinite"] = metrics["train/nonfinite_losses"]
    result["pieces"] = pieces["n"]
    result["images_per_rank"] = n_images
    result["update_image_fraction"] = metrics["train/update_image_fraction"]
    if trainer.engine is not None:  # the fp32 masters that dit.safetensors and the EMA are taken from
        masters = fp32_master_state_dict(trainer.dit_module, trainer.engine)
        with gathered_params(trainer.dit_module, trainer.zero_stage):
            live = {n: p.detach().float().clone() for n, p in trainer.dit_module.named_parameters()}
            result["module_dtype"] = str(next(trainer.dit_module.parameters()).dtype)
        result["master_vs_module"] = max(float((masters[n] - live[n]).abs().max()) for n in live)
        result["master_bf16_vs_module"] = max(float((masters[n].bfloat16().float() - live[n]).abs().max())
                                              for n in live)
        result["master_keys_ok"] = set(masters) == set(trainer.dit_module.state_dict())
    result["optimizer_steps"] = trainer.counters["optimizer_steps"]
    result["skipped_updates"] = trainer.counters["skipped_updates"]
    if skip:
        ema1 = trainer.ema.full_state_dict()
        result["ema_unchanged"] = all(torch.equal(ema0[k], ema1[k]) for k in ema0)
    return result


def main():
    names = sys.argv[1].split(",")
    configs = {"none": "", "zero2": str(DS / "zero2.json"), "zero3": str(DS / "zero3.json"),
               "zero3_offload": str(DS / "zero3_offload.json"), "zero3_sd3": str(DS / "zero3_sd3.json"),
               "zero3_all": zero3_all(), "zero2_skip": str(DS / "zero2.json"),
               "zero2_bf16": str(DS / "zero2.json"), "zero3_all_bf16": zero3_all()}
    configs.update({f"{base}_{kind}": configs[base] for base in ("none", "zero3_all") for kind in ("zeroadv", "skipadv")})
    out = Path(tempfile.mkdtemp(prefix="zero_grad_"))
    report, refs = {}, {}
    for case in names:
        base, nan_last = (case[: -len("_nan_last")], True) if case.endswith("_nan_last") else (case, False)
        bf16 = base.endswith("_bf16")
        adv_kind = base.rsplit("_", 1)[-1] if base.endswith(("_zeroadv", "_skipadv")) else ""
        ref_key = "none_nan_last" if nan_last else ("none_zeroadv" if adv_kind else "none")
        res = one_update(case, configs[base], out, nan_last=nan_last, skip=case.endswith("_skip"), bf16=bf16,
                         zero_adv=adv_kind == "zeroadv", skip_adv=adv_kind == "skipadv")
        if case == ref_key:
            refs[case] = res
        ref = refs.get(ref_key)
        if dist.rank() != 0:
            continue
        rep = {k: res.get(k) for k in ("grad_norm", "nonfinite", "pieces", "partitioned", "optimizer_steps",
                                       "skipped_updates", "ema_unchanged", "module_dtype", "master_vs_module",
                                       "master_bf16_vs_module", "master_keys_ok", "images_per_rank",
                                       "update_image_fraction")}
        if case != ref_key and not case.endswith("_skip") and not bf16:
            diff = max(float((res["grads"][n] - ref["grads"][n]).abs().max()) for n in ref["grads"])
            scale = max(float(g.abs().max()) for g in ref["grads"].values())
            full = torch.cat([ref["grads"][n] for n in ref["grads"]])
            mine = torch.cat([res["grads"][n] for n in ref["grads"]])
            rep.update(max_abs_diff=diff, ref_max_abs=scale, norm_ratio=float(mine.norm() / full.norm()))
            if ref_key == "none_zeroadv" and "none" in refs:  # how much zeroing the advantages moved the gradient
                rep["diff_vs_unzeroed"] = max(float((res["grads"][n] - refs["none"]["grads"][n]).abs().max())
                                              for n in ref["grads"])
        report[case] = rep
    if dist.rank() == 0:
        print("ZERO_GRAD_REPORT " + json.dumps(report), flush=True)
    torch.distributed.barrier()
    shutil.rmtree(out, ignore_errors=True)  # this rank's scratch folder (the exit below skips atexit)
    # An orderly gloo shutdown: without it a rank can abort at interpreter exit ("terminate called without an active
    # exception", seen once in a fresh-clone CI run on 2026-12-02) after the report was printed.
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
    from deepgen_rl.utils.dist import exit_without_teardown

    exit_without_teardown()  # results are out: no interpreter teardown (its gloo abort, deepgen_rl.utils.dist)
