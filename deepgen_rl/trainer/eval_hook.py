"""Evaluation inside training: every rank generates its shard, judges it, verdicts are all-gathered (JSON).

Every function here takes what it uses (model, DiT, specs, world layout, an autocast context), never the trainer.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable, ContextManager

import torch

from deepgen_rl.evaluation.config import EvalDatasetSpec, load_eval_config
from deepgen_rl.evaluation.runner import run_unigenbench_eval
from deepgen_rl.trainer.deepspeed_utils import dit_from_state
from deepgen_rl.utils import dist

log = logging.getLogger(__name__)


def load_training_eval_specs(eval_dataset_config: str, max_prompts: int = 0) -> list[EvalDatasetSpec]:
    """The eval YAML's datasets, each cut to its first ``max_prompts`` prompts when ``max_prompts > 0``."""
    specs = load_eval_config(eval_dataset_config)
    if max_prompts > 0:
        for spec in specs:
            spec.prompts = spec.prompts[:max_prompts]
    return specs


def ema_transformer(live: torch.nn.Module, ema, device, dtype: torch.dtype):
    """A fresh DiT (built from ``live``'s config) holding the weights of ``ema`` (a
    :class:`deepgen_rl.trainer.ema.PartitionedEMA`); None when EMA is off.

    Collective under ZeRO (every rank evaluates): the EMA is kept per rank as fragments of the fp32 masters and
    assembled here one parameter at a time (:meth:`deepgen_rl.trainer.ema.PartitionedEMA.iter_full`), each converted
    at once to the eval dtype on the device, so the peak is one eval-dtype copy plus one fp32 parameter. Built from
    the config rather than copied, so it also works when the live DiT is partitioned by ZeRO-3; see
    :func:`deepgen_rl.trainer.deepspeed_utils.dit_from_state`.
    """
    if ema is None:
        return None
    missing = {n for n, _ in live.named_parameters()} - set(ema.names())
    if missing:
        raise RuntimeError(f"EMA weights lack {sorted(missing)[:5]}")
    state = {n: t.to(device, dtype) for n, t in ema.iter_full(device)}
    # built on the meta device and filled tensor by tensor in the eval dtype: no random fp32 DiT on the host
    return dit_from_state(live, state, device=device, dtype=dtype, copy=False)  # read-only


def run_training_eval(model, transformer: torch.nn.Module, specs: list[EvalDatasetSpec], output_dir: str | Path,
                      step: int, *, rank: int, world_size: int, autocast: Callable[[], ContextManager],
                      live_dit: torch.nn.Module | None = None, **generation) -> dict:
    """Generate and judge ``specs`` with ``transformer`` into ``output_dir/eval``; returns the gathered metrics.

    ``live_dit`` (the training DiT, default ``transformer``) is put in eval mode for the duration and restored.
    ``generation`` is passed on to :func:`deepgen_rl.evaluation.runner.run_unigenbench_eval` (height, width, seed,
    judge, inference_mode, eta, sampler, batch_size, progress).
    """
    live = transformer if live_dit is None else live_dit
    was_training = live.training
    live.eval()
    try:
        with torch.no_grad(), autocast():
            return run_unigenbench_eval(
                model, specs, Path(output_dir) / "eval", step, rank=rank, world_size=world_size,
                barrier_fn=dist.barrier, gather_fn=dist.all_gather_json, transformer=transformer, **generation)
    finally:
        live.train(was_training)
