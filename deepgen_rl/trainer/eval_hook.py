"""Evaluation inside training: every rank generates its shard, judges it, verdicts are all-gathered (JSON)."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from deepgen_rl.evaluation.config import load_eval_config
from deepgen_rl.evaluation.runner import run_unigenbench_eval
from deepgen_rl.trainer.deepspeed_utils import dit_from_state
from deepgen_rl.utils import dist

log = logging.getLogger(__name__)


def _ema_transformer(trainer):
    """A fresh DiT (built from the live one's config) holding the EMA weights; None when EMA is off.

    Collective under ZeRO (every rank evaluates): the EMA is kept per rank as fragments of the fp32 masters and
    assembled here one parameter at a time (:meth:`deepgen_rl.trainer.ema.PartitionedEMA.iter_full`), each converted
    at once to the eval dtype on the device, so the peak is one eval-dtype copy plus one fp32 parameter. Built from
    the config rather than copied, so it also works when the live DiT is partitioned by ZeRO-3; see
    :func:`deepgen_rl.trainer.deepspeed_utils.dit_from_state`.
    """
    if trainer.ema is None:
        return None
    live = trainer.dit_module
    missing = {n for n, _ in live.named_parameters()} - set(trainer.ema.names())
    if missing:
        raise RuntimeError(f"EMA weights lack {sorted(missing)[:5]}")
    dtype = torch.bfloat16 if trainer.args.bf16 else torch.float32
    state = {n: t.to(trainer.device, dtype) for n, t in trainer.ema.iter_full(trainer.device)}
    # built on the meta device and filled tensor by tensor in the eval dtype: no random fp32 DiT on the host
    return dit_from_state(live, state, device=trainer.device, dtype=dtype, copy=False)  # read-only


def run_training_eval(trainer, step: int) -> dict:
    args = trainer.args
    specs = load_eval_config(trainer.eval_dataset_config)
    if args.eval_max_prompts > 0:
        for spec in specs:
            spec.prompts = spec.prompts[: args.eval_max_prompts]
    transformer = _ema_transformer(trainer) or trainer.dit_module
    was_training = trainer.dit_module.training
    trainer.dit_module.eval()
    try:
        with torch.no_grad(), trainer._autocast():
            metrics = run_unigenbench_eval(
                trainer.deepgen, specs, Path(args.output_dir) / "eval", step, rank=trainer.rank,
                world_size=trainer.world, barrier_fn=dist.barrier, gather_fn=dist.all_gather_json,
                transformer=transformer, height=args.image_height, width=args.image_width, seed=args.seed,
                judge=args.eval_judge, inference_mode=args.eval_inference_mode, eta=args.sde_eta,
                sampler=args.atrain_sde_sampler, batch_size=args.rollout_micro_batch_size,
                progress=trainer.rank == 0 and not args.disable_tqdm)
    finally:
        trainer.dit_module.train(was_training)
    return metrics
