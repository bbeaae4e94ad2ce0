"""DeepGenGRPOTrainer: MR-GRPO for DeepGen. Reads like the algorithm:

    rollout -> rewards (overlapping the rollout) -> global advantages -> policy update (ONE optimizer step) -> log

It subclasses ``transformers.Trainer`` for arguments, optimizer/scheduler construction, callbacks and loggers
(``report_to``), and replaces ``train()`` with the GRPO loop (a rollout batch is not a dataloader batch, and the
update must step the optimizer exactly once per rollout batch, also under DeepSpeed, whose accumulation boundary
is driven explicitly here).
"""

from __future__ import annotations

import json
import math
import time
from contextlib import nullcontext
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import Trainer
from transformers.utils import logging

from deepgen_rl.config import GRPOConfig, batch_layout
from deepgen_rl.data.prompts import DistributedPromptSampler, load_train_config
from deepgen_rl.models.deepgen.cpu_gelu import use_cpu_fast_gelu
from deepgen_rl.rewards import get_reward
from deepgen_rl.rewards.base import MultiRewardOutput
from deepgen_rl.rl.advantages import AdvantageOutput, compute_advantages
from deepgen_rl.rl.samplers import make_sigmas, sde_window, stochastic_step_mask, trained_step_indices
from deepgen_rl.rollout import expand_groups, rollout
from deepgen_rl.trainer.loggers import init_swanlab
from deepgen_rl.trainer.deepspeed_utils import (build_deepspeed_config, cpu_adam_problem, dit_from_state,
                                                 dit_hidden_size, partitioned_fraction, skip_cpu_shm_comm_op)
from deepgen_rl.rl.objectives import OBJECTIVES, PieceInputs
from deepgen_rl.trainer.ema import PartitionedEMA
from deepgen_rl.trainer.policy import UpdateStats, policy_piece_loss, update_indices
from deepgen_rl.trainer.reward_overlap import GroupedRewardScheduler
from deepgen_rl.trainer.reward_workers import DaemonExecutor
from deepgen_rl.trainer.time_budget import TimeBudget
from deepgen_rl.trainer.visuals import save_sample_grid
from deepgen_rl.utils import dist
from deepgen_rl.utils.seeding import make_generator

logger = logging.get_logger(__name__)


def weighted_total(scores: torch.Tensor, weights: torch.Tensor, valid: torch.Tensor):
    """Per image Σ_k w·r / Σ_k w over the rewards that succeeded (failed ones are left out, never counted as 0).

    Returns (total (N,), has (N,) bool: the image has at least one successful weighted reward; total is 0 where not).
    """
    w = weights * valid
    has = w.sum(1) > 0
    return (scores * w).sum(1) / w.sum(1).clamp_min(1e-12), has


@dataclass
class StepResult:
    """What one GRPO step produced; metrics, rollout records and the sample grid all read it.

    batch: this rank's RolloutBatch (N images); weights: (N, K) fp32; rewards: this rank's MultiRewardOutput
    ((N, K) scores / valid and per-reward counters); g_scores / g_valid / g_weights: the same gathered over ranks
    (world·N, K); adv_out: the global AdvantageOutput; advantages: (N,) fp32 of this rank (negated under
    --negate_advantages); update_stats: one dict per optimizer update; timings: perf_counter at start, rollout end,
    rewards collected, update end.
    """

    batch: Any
    weights: torch.Tensor
    rewards: MultiRewardOutput
    g_scores: torch.Tensor
    g_valid: torch.Tensor
    g_weights: torch.Tensor
    adv_out: AdvantageOutput
    advantages: torch.Tensor
    update_stats: list[dict]
    timings: tuple[float, float, float, float]


class DeepGenGRPOTrainer(Trainer):
    """Trains ``model.transformer`` (the DiT) of a DeepGen model with MR-GRPO."""

    def __init__(self, model, args: GRPOConfig, *, dataset_config: str, eval_dataset_config: str | None = None,
                 sftaux_dataset_config: str | None = None, rewards: dict | None = None, run_configs: dict | None = None,
                 callbacks=None):
        dist.init_process_group_if_needed(timeout_s=args.ddp_timeout)
        self.deepgen = model
        self.rank, self.world = dist.rank(), dist.world_size()
        self.layout = batch_layout(args, self.world)
        self.data_config = load_train_config(dataset_config)
        self.reward_names = self.data_config.reward_names
        self.sampler = DistributedPromptSampler(self.data_config, self.layout["prompts_per_rank"], rank=self.rank,
                                                world_size=self.world, seed=args.seed)
        if rewards is None:
            rewards = {n: get_reward(n, **args.reward_kwargs_dict.get(n, {})) for n in self.reward_names}
        missing = [n for n in self.reward_names if n not in rewards]
        if missing:
            raise ValueError(f"no reward object for {missing} (named in {dataset_config})")
        self.rewards = rewards
        self.eval_dataset_config = eval_dataset_config or None
        if self.eval_dataset_config and args.eval_freq:
            from deepgen_rl.evaluation.config import load_eval_config

            load_eval_config(self.eval_dataset_config)  # fail at start-up, not at the first evaluation
        self.sftaux_dataset_config = sftaux_dataset_config or None
        self.run_configs = run_configs or {}
        self.device = args.device
        model.freeze_non_trainable()
        model.to(self.device)
        dit = model.transformer
        # fp32 master weights for the trained DiT (bf16 compute comes from autocast or DeepSpeed's bf16 mode)
        dit.float()
        dit.requires_grad_(True)
        dit.train()
        if args.gradient_checkpointing:
            model.enable_gradient_checkpointing()
        model.cpu_fast_gelu = bool(args.cpu_fast_gelu)  # predict_velocity patches every DiT it runs (cpu_gelu.py)
        if args.cpu_fast_gelu:
            n = use_cpu_fast_gelu(dit)
            if n == 0:
                raise ValueError("--cpu_fast_gelu true: the DiT has no tanh-approximate diffusers GELU to replace")
            logger.warning(f"--cpu_fast_gelu: the DiT's {n} tanh GELUs run as x*sigmoid(2u) on CPU tensors")
        super().__init__(model=dit, args=args, callbacks=callbacks)
        self.counters = {"optimizer_steps": 0, "vlm_prompt_encodings": 0, "skipped_updates": 0}
        self.engine = None
        self.ref_dit = None
        self.ema = None
        self.sftaux = None

    # ------------------------------------------------------------------ set-up
    def _setup_optimization(self, max_steps: int):
        args = self.args
        updates = max_steps * args.atrain_num_actor_update_steps
        dit = self.deepgen.transformer
        if args.beta > 0 and OBJECTIVES[args.atrain_algorithm].uses_reference_dit:  # e.g. NFT has no KL term
            # frozen, so no master weights: built straight in bf16 (no transient fp32 deepcopy of the DiT)
            self.ref_dit = dit_from_state(dit, dit.state_dict(), device=self.device,
                                          dtype=torch.bfloat16 if args.bf16 else torch.float32)
        if args.deepspeed_config:
            import deepspeed

            skip_cpu_shm_comm_op()
            if not dist.is_dist():
                deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo")
            ds_config = build_deepspeed_config(args.deepspeed_config, args, self.world,
                                               hidden_size=dit_hidden_size(dit),
                                               gloo=dist.comm_backend() == "gloo")
            problem = cpu_adam_problem(ds_config)
            if problem:
                raise RuntimeError(f"--deepspeed {args.deepspeed_config}: {problem}")
            if "optimizer" in ds_config:
                # the JSON asks DeepSpeed for its own optimizer (e.g. DeepSpeedCPUAdam for ZeRO-Offload); the HF LR
                # schedule is then built on the optimizer DeepSpeed creates
                def make_scheduler(ds_optimizer):
                    base = getattr(ds_optimizer, "optimizer", ds_optimizer)
                    return self.create_scheduler(num_training_steps=updates, optimizer=base)

                self.engine, self.optimizer, _, self.lr_scheduler = deepspeed.initialize(
                    model=dit, model_parameters=[p for p in dit.parameters() if p.requires_grad],
                    lr_scheduler=make_scheduler, config=ds_config, dist_init_required=False)
            else:
                self.create_optimizer()
                self.create_scheduler(num_training_steps=updates, optimizer=self.optimizer)
                self.engine, self.optimizer, _, self.lr_scheduler = deepspeed.initialize(
                    model=dit, optimizer=self.optimizer, lr_scheduler=self.lr_scheduler, config=ds_config,
                    dist_init_required=False)
            self.zero_stage = int(ds_config.get("zero_optimization", {}).get("stage", 0))
            if self.zero_stage == 3 and self.rank == 0:
                parted, total = partitioned_fraction(self.dit_module)
                gathers = "one at a time" if self.engine.zero_allgather_sequential() else "coalesced"
                logger.warning(f"ZeRO-3: {parted} of {total} DiT parameter tensors partitioned over {self.world} "
                               f"rank(s) (the rest are below stage3_param_persistence_threshold); "
                               f"{dist.comm_backend()} gathers parameters {gathers}")
        else:
            self.create_optimizer()
            self.create_scheduler(num_training_steps=updates, optimizer=self.optimizer)
            self.zero_stage = 0
        if args.ema_decay > 0:  # of this rank's fp32 master partition (not the bf16 module weights)
            self.ema = PartitionedEMA(self.dit_module, self.engine)
        if args.sftaux_coef > 0 and self.sftaux_dataset_config:
            from deepgen_rl.sft.loss import SFTAuxiliary

            self.sftaux = SFTAuxiliary(self.sftaux_dataset_config, self.deepgen, rank=self.rank,
                                       world_size=self.world, seed=args.seed,
                                       micro_batch_size=args.sftaux_micro_batch_size,
                                       latent_cache_mb=args.sftaux_latent_cache_mb)
        elif args.sftaux_coef > 0:
            logger.warning("sftaux_coef > 0 but no --sftaux_dataset_config: the SFT-auxiliary loss is off")

    def is_world_process_zero(self) -> bool:
        return self.rank == 0

    def is_local_process_zero(self) -> bool:
        return dist.local_rank() == 0

    @property
    def dit_module(self):
        """The DiT ``nn.Module`` (DeepSpeed's wrapped module when an engine exists): rollout, eval, checkpoints."""
        return self.engine.module if self.engine is not None else self.deepgen.transformer

    @property
    def dit_forward(self):
        """What TRAINED forwards (whose loss is backpropagated) must call: the DeepSpeed engine when there is one.

        ZeRO-3 counts micro-steps in ``engine.forward`` only; a forward through ``engine.module`` makes the next
        backward overwrite the accumulated gradient instead of adding to it (only the last backward would count).
        """
        return self.engine if self.engine is not None else self.deepgen.transformer

    def autocast(self):
        """bf16 autocast for plain-torch CUDA runs (DeepSpeed runs its own bf16 mode); a null context otherwise."""
        if self.args.bf16 and torch.cuda.is_available() and self.engine is None:
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return nullcontext()

    # ------------------------------------------------------------------ main loop
    def train(self, resume_from_checkpoint: str | bool | None = None, **kwargs):
        args = self.args
        steps_per_epoch = self.sampler.steps_per_epoch
        max_steps = args.max_steps if args.max_steps and args.max_steps > 0 else int(
            math.ceil(args.num_train_epochs * steps_per_epoch))
        if self.rank == 0:
            logger.warning(
                f"MR-GRPO: {self.world} rank(s); per step {self.layout['global_prompts']} prompts x {args.rollout_n} "
                f"= {self.layout['global_images']} images ({self.layout['prompts_per_rank']} prompts / "
                f"{self.layout['images_per_rank']} images per rank); {steps_per_epoch} steps/epoch; {max_steps} steps")
        self._setup_optimization(max_steps)
        self.state.max_steps = max_steps
        self.state.global_step = 0
        start_step = self._maybe_resume(resume_from_checkpoint)
        self.state.max_steps = max_steps  # a resumed state carries the old run's max_steps
        # accelerate may not see the torchrun group on CPU: the rank decides who logs
        self.state.is_world_process_zero = self.rank == 0
        self.state.is_local_process_zero = dist.local_rank() == 0
        if self.rank == 0 and "swanlab" in (args.report_to or []):
            init_swanlab(args)
        self.control = self.callback_handler.on_train_begin(args, self.state, self.control)
        self._executor = DaemonExecutor(max_workers=max(1, args.reward_workers), thread_name_prefix="reward")
        self.history: list[dict] = []
        budget, out_of_time = TimeBudget(args.max_train_minutes, start_unix=args.max_train_minutes_from), False
        if budget.active and args.max_train_minutes_from and self.rank == 0:
            logger.warning(f"--max_train_minutes {args.max_train_minutes:g}: {budget.elapsed_s() / 60:.2f} of them "
                           "spent before training")
        try:
            if args.eval_at_start and start_step == 0:
                self._timed_eval(budget, 0, force=True)
            for step in range(start_step, max_steps):
                t_loop = budget.clock()
                metrics = self.grpo_step(step)
                self.state.global_step = step + 1
                self.state.epoch = (step + 1) / steps_per_epoch
                self.history.append(metrics)
                self._append_metrics(step + 1, metrics)
                self.log(metrics)
                self.control = self.callback_handler.on_step_end(args, self.state, self.control)
                if args.save_steps and (step + 1) % int(args.save_steps) == 0:
                    self.save_checkpoint(step + 1)
                t_eval = budget.clock()
                self._timed_eval(budget, step + 1)
                if self.control.should_training_stop:
                    break
                budget.step_done(t_eval - t_loop)
                if budget.active and step + 1 < max_steps and dist.any_rank(budget.next_step_would_overrun()):
                    out_of_time = True
                    break
            if out_of_time:
                self._stop_for_time(budget)
            if self.state.global_step and self._saved_step != self.state.global_step:
                self.save_checkpoint(self.state.global_step)  # the final weights, always (a stale folder is replaced)
        except BaseException:
            # Ctrl-C or a crash: do not wait for pending reward requests (they may be retrying a dead service)
            self._executor.shutdown(wait=False, cancel_futures=True)
            raise
        self._executor.shutdown(wait=True)
        self.control = self.callback_handler.on_train_end(args, self.state, self.control)
        return self.history

    def _timed_eval(self, budget: TimeBudget, step: int, force: bool = False) -> None:
        """``_maybe_eval``, its duration kept by the budget when a step's eval will follow the budget's stop."""
        t = budget.clock()
        if self._maybe_eval(step, force=force) and self.args.eval_freq:
            budget.eval_done(budget.clock() - t)

    def _stop_for_time(self, budget: TimeBudget) -> None:
        """Stopped by --max_train_minutes: say so, and evaluate the last step (the checkpoint follows in train)."""
        step = self.state.global_step
        if self.rank == 0:
            logger.warning(
                f"--max_train_minutes {self.args.max_train_minutes:g}: stopping after step {step} of "
                f"{self.state.max_steps} ({budget.elapsed_s() / 60:.2f} minutes of the budget spent; a step takes "
                f"~{budget.step_estimate_s():.1f} s, an eval ~{budget.eval_reserve_s:.1f} s); evaluating and saving "
                f"step {step} (--max_steps {step} without a budget trains the same weights)")
        if self.args.eval_freq and step % self.args.eval_freq:
            self._maybe_eval(step, force=True)  # the eval_freq steps were evaluated in the loop

    def _append_metrics(self, step: int, metrics: dict) -> None:
        """OUTPUT_DIR/metrics.jsonl, one line per step, written as it happens (survives a crash)."""
        if self.rank == 0:
            with open(Path(self.args.output_dir) / "metrics.jsonl", "a", encoding="utf-8") as f:
                f.write(json.dumps({"step": step, **metrics}) + "\n")

    # ------------------------------------------------------------------ one GRPO step
    def grpo_step(self, step: int) -> dict:
        """One GRPO step: rollout (rewards scored while it runs) -> global advantages -> policy update(s) -> log."""
        args, t0 = self.args, time.perf_counter()
        items = self.sampler.next_batch()
        sigmas, stochastic, trained = self._step_schedule(step)
        weights = self._reward_weights(items)
        prompts, metadata = expand_groups(items, args.rollout_n)  # the order rollout() uses
        scheduler = GroupedRewardScheduler(self._executor.submit, self.rewards, self.reward_names, prompts, metadata,
                                           weights, group_size=args.rollout_n)
        batch = self._rollout(items, step, sigmas, stochastic, on_micro_batch=scheduler.on_micro_batch)
        t_rollout = time.perf_counter()
        local = scheduler.collect()
        t_reward = time.perf_counter()
        # global advantages (gathered over ranks: groups and batch statistics are global)
        g_scores, g_valid = dist.all_gather_cat(local.scores), dist.all_gather_cat(local.valid)
        g_weights, g_groups = dist.all_gather_cat(weights), dist.all_gather_cat(batch.group_ids)
        adv_out = compute_advantages(args.atrain_adv_type, g_scores, g_weights, g_groups, g_valid,
                                     clip_max=args.adv_clip_max)
        n = len(batch)
        advantages = adv_out.advantages[self.rank * n:(self.rank + 1) * n].float()
        if args.negate_advantages:
            advantages = -advantages
        # policy update(s): exactly one optimizer step each
        keep = update_indices(adv_out.advantages, self.rank, n, args.zero_advantage_tol
                              if args.skip_zero_advantage else None)
        update_stats = [self._policy_update(batch, advantages, trained, u, keep)
                        for u in range(args.atrain_num_actor_update_steps)]
        result = StepResult(batch, weights, local, g_scores, g_valid, g_weights, adv_out, advantages, update_stats,
                            timings=(t0, t_rollout, t_reward, time.perf_counter()))
        if args.save_rollout_records:
            self._write_rollout_records(step, result)
        if args.log_images_every and (step + 1) % args.log_images_every == 0 and self.rank == 0:
            self._save_grid(step, result)
        return self._step_metrics(result)

    def _step_schedule(self, step: int):
        """(sigmas (T+1,), stochastic (T,) bool, trained step indices) of this step (seeded by step and rank)."""
        args, T = self.args, self.args.num_inference_steps
        sigmas = make_sigmas(T, self.deepgen.scheduler_shift)
        window = sde_window(T, args.sde_window_size, args.window_range(),
                            make_generator("window", args.seed, step)) if args.sde_window_size > 0 else None
        stochastic = torch.tensor(stochastic_step_mask(T, window))
        trained = trained_step_indices(
            T, timestep_fraction=None if window else args.timestep_fraction, window=window,
            generator=make_generator("timesteps", args.seed, step, self.rank))
        return sigmas, stochastic, trained

    def _reward_weights(self, items) -> torch.Tensor:
        """Per-image reward weights (N, K) fp32 from each image's dataset (N = prompts x rollout_n)."""
        per_prompt = [[self.data_config.datasets[it.dataset_index].reward_weights.get(n, 0.0)
                       for n in self.reward_names] for it in items]
        return torch.tensor([w for w in per_prompt for _ in range(self.args.rollout_n)], dtype=torch.float32)

    def _rollout(self, items, step: int, sigmas, stochastic, on_micro_batch):
        args = self.args
        self.dit_module.eval()
        with self.autocast():
            batch = rollout(self.deepgen, items, rollout_n=args.rollout_n,
                            micro_batch_size=args.rollout_micro_batch_size, sigmas=sigmas, stochastic=stochastic,
                            sampler=args.atrain_sde_sampler, eta=args.sde_eta, cfg_scale=args.cfg_scale,
                            init_same_noise=args.init_same_noise,
                            share_ode_prefix=args.share_ode_prefix,
                            reuse_last_velocity=args.reuse_last_velocity, height=args.image_height, width=args.image_width,
                            seed=args.seed, step=step, rank=self.rank, transformer=self.dit_module,
                            storage_device=args.trajectory_device if args.trajectory_device == "cpu" else self.device,
                            on_micro_batch=on_micro_batch, progress=self.rank == 0 and not args.disable_tqdm)
        self.counters["vlm_prompt_encodings"] += batch.num_prompt_encodings
        return batch

    def _save_grid(self, step: int, r: "StepResult") -> None:
        total, has = weighted_total(r.rewards.scores, r.weights, r.rewards.valid)
        save_sample_grid(r.batch.images, r.batch.prompts, torch.where(has, total, float("nan")).tolist(),
                         Path(self.args.output_dir) / "samples" / f"step_{step + 1}.png",
                         report_to=self.args.report_to, step=step + 1)

    def _write_rollout_records(self, step: int, r: "StepResult") -> None:
        """OUTPUT_DIR/rollouts/step_N/rank_R.jsonl: per image prompt, group, rewards (null = failed/skipped), A."""
        out = Path(self.args.output_dir) / "rollouts" / f"step_{step + 1}"
        out.mkdir(parents=True, exist_ok=True)
        batch, scores, valid = r.batch, r.rewards.scores, r.rewards.valid
        lines = []
        for i in range(len(batch)):
            rec = {**batch.metadata[i], "prompt": batch.prompts[i], "advantage": float(r.advantages[i]),
                   "rewards": {n: (float(scores[i, k]) if bool(valid[i, k]) else None)
                               for k, n in enumerate(self.reward_names)},
                   "weights": {n: float(r.weights[i, k]) for k, n in enumerate(self.reward_names)},
                   "initial_noise_digest": float(batch.latents[i, 0].double().sum())}
            lines.append(json.dumps(rec))
        (out / f"rank_{self.rank}.jsonl").write_text("\n".join(lines) + "\n")

    def _policy_update(self, batch, advantages, trained, update_index: int, keep: list[int]) -> dict:
        """One optimizer update over the images ``keep`` (`update_indices`) of the rollout batch, at the ``trained``
        steps. The loss is scaled by 1/len(batch) whatever ``keep`` is (see `update_indices`); the statistics are
        means over the images the update ran on."""
        args = self.args
        dit = self.dit_module
        dit.train()
        n = len(batch)
        mbs = [keep[s:s + args.atrain_micro_batch_size] for s in range(0, len(keep), args.atrain_micro_batch_size)]
        lam = args.sftaux_coef if self.sftaux is not None and (
            self.counters["optimizer_steps"] % args.sftaux_every_n_steps == 0) else 0.0
        pieces = [(mb, j) for mb in mbs for j in trained]
        inputs = self.piece_inputs()
        self._boundary_backward_done = False
        sums = UpdateStats()  # on the device: the update's statistics reach the host in one transfer, at the end
        nonfinite = 0
        total_backward = len(pieces) + (1 if lam > 0 else 0)
        done = 0
        for mb, j in pieces:
            with self.autocast():
                loss, stats = policy_piece_loss(inputs, batch, advantages, mb, j)
            scale = (1.0 - lam) * len(mb) / n / len(trained)
            finite = self._all_finite(loss)
            done += 1
            if not finite:
                nonfinite += 1
                continue
            self._backward(loss * scale, is_last=done == total_backward)
            sums.add(stats, len(mb), len(keep), len(trained))
            if update_index == 0:  # before the first optimizer step the policy IS the rollout policy
                sums.running_max("first_ratio_max_abs_dev", stats, "ratio_max_abs_dev")
        if lam > 0:
            with self.autocast():
                sft_loss, sft_stats = self.sftaux.loss(transformer=self.dit_forward)
            done += 1
            if self._all_finite(sft_loss):
                self._backward(sft_loss * lam, is_last=True)
                sums.set("sft_loss", sft_loss)
            else:
                nonfinite += 1
        skip = nonfinite == total_backward
        if not skip and self.engine is not None and not self._boundary_backward_done:
            # The last piece was non-finite and skipped, so no backward ran at DeepSpeed's accumulation boundary
            # (where ZeRO reduces the accumulated gradients). Close it with a backward of an exactly-zero loss
            # that touches every DiT parameter through a real forward.
            self._zero_boundary_backward(batch)
        grad_norm = self._optimizer_step(skip)
        acc = sums.to_host()
        acc["nonfinite_losses"] = float(nonfinite)
        acc["update_image_fraction"] = len(keep) / n
        acc["grad_norm"] = grad_norm
        return acc

    def piece_inputs(self) -> PieceInputs:
        """The frozen inputs every piece loss of this update reads (see :class:`PieceInputs`)."""
        args = self.args
        return PieceInputs(
            model=self.deepgen, transformer=self.dit_forward, ref_transformer=self.ref_dit, device=self.device,
            dtype=next(self.dit_module.parameters()).dtype, step=self.state.global_step, rank=self.rank,
            seed=args.seed, algorithm=args.atrain_algorithm, sampler=args.atrain_sde_sampler, eta=args.sde_eta,
            cfg_scale=args.cfg_scale, clip_range=args.clip_range, beta=args.beta, kl_type=args.atrain_kl_type,
            adv_clip_max=args.adv_clip_max, nft_beta=args.diffusionnft_beta)

    def _zero_boundary_backward(self, batch) -> None:
        x = torch.zeros_like(batch.latents[:1, 0]).to(self.device)
        cond = batch.cond.index_select(torch.zeros(1, dtype=torch.long, device=self.device))
        with self.autocast():
            v = self.deepgen.predict_velocity(x, torch.full((1,), 0.5, device=self.device), cond,
                                              transformer=self.dit_forward)
        self._backward(v.float().sum() * 0.0, is_last=True)

    def _all_finite(self, loss: torch.Tensor) -> bool:
        """``loss`` is finite on every rank. The one host sync per piece that stays: it decides whether the piece's
        backward runs, and every rank must decide alike before the backward's collectives."""
        bad = torch.isfinite(loss.detach()).all().logical_not().float().reshape(1)
        if dist.is_dist():
            bad = dist.all_gather_cat(bad).max().reshape(1)
        return bad.item() == 0.0

    def _backward(self, loss: torch.Tensor, *, is_last: bool) -> None:
        if self.engine is not None:
            self.engine.set_gradient_accumulation_boundary(is_last)
            self.engine.backward(loss)
        else:
            loss.backward()
        self._boundary_backward_done = self._boundary_backward_done or is_last

    def _optimizer_step(self, skip: bool) -> float:
        """ONE optimizer update (plus LR scheduler and EMA). Returns the gradient norm (before clipping)."""
        args = self.args
        if skip:
            self.counters["skipped_updates"] += 1
            if self.engine is None:
                self.optimizer.zero_grad(set_to_none=True)
            return float("nan")
        if self.engine is not None:
            self.engine.set_gradient_accumulation_boundary(True)
            self.engine.step()
            if not self.engine.was_step_applied():  # e.g. fp16/bf16 overflow: no update, so no EMA, no count
                self.counters["skipped_updates"] += 1
                logger.warning("DeepSpeed skipped the optimizer step (gradient overflow): not counted as applied")
                return float("nan")
            norm = self.engine.get_global_grad_norm()
            grad_norm = float(norm) if norm is not None else float("nan")
        else:
            params = [p for p in self.deepgen.transformer.parameters() if p.requires_grad]
            if dist.is_dist():
                for p in params:
                    if p.grad is not None:
                        torch.distributed.all_reduce(p.grad)
                        p.grad /= self.world
            grad_norm = float(torch.nn.utils.clip_grad_norm_(params, args.max_grad_norm or float("inf")))
            if not math.isfinite(grad_norm):  # finite losses can still overflow in backward: never apply that
                self.counters["skipped_updates"] += 1
                self.optimizer.zero_grad(set_to_none=True)
                logger.warning("non-finite gradient norm (%s): optimizer update skipped", grad_norm)
                return grad_norm
            self.optimizer.step()
            self.lr_scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)
        self.counters["optimizer_steps"] += 1
        if self.ema is not None:
            self.ema.update(args.ema_decay)  # local: each rank's fragments of the fp32 masters, no collective
        return grad_norm

    # ------------------------------------------------------------------ metrics
    def _step_metrics(self, r: "StepResult") -> dict:
        batch, g_scores, g_valid, g_weights, update_stats = r.batch, r.g_scores, r.g_valid, r.g_weights, r.update_stats
        reward_info = r.rewards.info["per_reward"]
        t0, t_rollout, t_reward, t_update = r.timings
        m: dict[str, float] = {}
        total, has = weighted_total(g_scores, g_weights, g_valid)
        m["reward/total"] = float(total[has].mean()) if has.any() else float("nan")
        for k, name in enumerate(self.reward_names):
            sel = g_valid[:, k]
            m[f"reward/{name}"] = float(g_scores[sel, k].mean()) if sel.any() else float("nan")
            asked = g_weights[:, k] > 0
            m[f"reward_failures/{name}"] = float((asked & ~g_valid[:, k]).sum())
            m[f"reward_calls/{name}"] = float(asked.sum())
            if name in reward_info:  # this rank's reward calls: wall time spent inside the reward
                m[f"reward_latency_s/{name}"] = float(reward_info[name]["latency_s"])
        local_total, local_has = weighted_total(r.rewards.scores, r.weights, r.rewards.valid)
        for ds in self.data_config.datasets:
            sel = torch.tensor([md["dataset"] == ds.name for md in batch.metadata]) & local_has
            if sel.any():
                m[f"reward_by_dataset/{ds.name}"] = float(local_total[sel].mean())
        for k, v in r.adv_out.stats.items():
            if isinstance(v, (int, float)):
                m[f"advantage/{k}"] = float(v)
        train = {k: float(sum(u.get(k, 0.0) for u in update_stats) / len(update_stats)) for k in update_stats[0]}
        train = dist.all_reduce_mean(train)  # rank-local stats -> means over ranks
        m.update({f"train/{k}": v for k, v in train.items()})
        m["train/first_ratio_max_abs_dev"] = update_stats[0].get("first_ratio_max_abs_dev", 0.0)
        m["train/optimizer_steps"] = float(self.counters["optimizer_steps"])
        if self.engine is not None:  # DeepSpeed's own count of optimizer steps, independent of ours
            m["train/engine_global_steps"] = float(self.engine.global_steps)
        m["train/skipped_updates"] = float(self.counters["skipped_updates"])
        m["train/vlm_prompt_encodings"] = float(batch.num_prompt_encodings)
        m["train/lr"] = float(self.lr_scheduler.get_last_lr()[0]) if self.lr_scheduler is not None else 0.0
        m["time/rollout_s"] = t_rollout - t0
        m["time/reward_wait_s"] = t_reward - t_rollout
        m["time/update_s"] = t_update - t_reward
        m["time/step_s"] = t_update - t0
        m["time/images_per_s"] = len(batch) * self.world / max(t_update - t0, 1e-9)
        return m

    # ------------------------------------------------------------------ evaluation
    def _maybe_eval(self, step: int, force: bool = False) -> bool:
        """Evaluate at ``step`` when an eval set is given and ``force`` or ``step`` is an eval_freq step; True if it
        did."""
        args = self.args
        if not self.eval_dataset_config or (not force and (not args.eval_freq or step % args.eval_freq)):
            return False
        from deepgen_rl.trainer.eval_hook import ema_transformer, load_training_eval_specs, run_training_eval

        specs = load_training_eval_specs(self.eval_dataset_config, args.eval_max_prompts)
        ema_dit = ema_transformer(self.dit_module, self.ema, self.device,
                                  torch.bfloat16 if args.bf16 else torch.float32)
        metrics = run_training_eval(
            self.deepgen, ema_dit or self.dit_module, specs, args.output_dir, step, rank=self.rank,
            world_size=self.world, autocast=self.autocast, live_dit=self.dit_module, height=args.image_height,
            width=args.image_width, seed=args.seed, judge=args.eval_judge, inference_mode=args.eval_inference_mode,
            eta=args.sde_eta, sampler=args.atrain_sde_sampler, batch_size=args.rollout_micro_batch_size,
            progress=self.rank == 0 and not args.disable_tqdm)
        if metrics:
            self.log(metrics)
        return True

    # ------------------------------------------------------------------ checkpoints
    def stateful_parts(self) -> dict:
        """Every piece of training state besides the DiT weights / DeepSpeed engine: checkpoint file name -> object
        with ``state_dict()`` / ``load_state_dict()``. Save and resume both walk this one mapping, so a piece added
        here is saved and restored; a piece missing here is neither."""
        from deepgen_rl.checkpoints.rl_format import EMA_DIT_FILE
        from deepgen_rl.checkpoints.training_state import DictState, Part, RngState
        from transformers import TrainerState

        def load_hf_state(state: dict) -> None:
            self.state = TrainerState(**state)

        parts: dict = {}
        if self.engine is None:  # under DeepSpeed the engine's own checkpoint holds optimizer and scheduler
            parts["optimizer.pt"] = self.optimizer
            parts["scheduler.pt"] = self.lr_scheduler
        if self.ema is not None:  # the EMA of the fp32 masters: each rank's fragments, full tensors in the file
            parts[EMA_DIT_FILE] = Part(lambda: self.ema.full_state_dict(rank=0, device=self.device),
                                       lambda state: self.ema.load_full_state_dict(state), collective=True,
                                       missing_message="has no EMA weights but --ema_decay > 0")
        parts["rng_state.pt"] = RngState()
        parts["sampler_state.json"] = self.sampler
        if self.sftaux is not None:  # optional: the SFT term may have been off when the checkpoint was written
            parts["sftaux_state.pt"] = Part(self.sftaux.state_dict, self.sftaux.load_state_dict, optional=True)
        parts["counters.json"] = DictState(self.counters)
        parts["trainer_state.json"] = Part(lambda: dataclasses.asdict(self.state), load_hf_state)
        return parts

    def _state_view(self):
        from deepgen_rl.checkpoints.training_state import TrainingStateView

        return TrainingStateView(dit=self.dit_module, engine=self.engine, zero_stage=self.zero_stage, rank=self.rank,
                                 world=self.world, parts=self.stateful_parts())

    def save_checkpoint(self, step: int) -> Path:
        from deepgen_rl.checkpoints.training_state import save_training_checkpoint

        args = self.args
        path = save_training_checkpoint(
            self._state_view(), args.output_dir, step, args_json=args.to_json_string(), run_configs=self.run_configs,
            save_total_limit=args.save_total_limit, has_ema=self.ema is not None,
            debug_delay_s=float(getattr(args, "debug_checkpoint_delay_s", 0.0) or 0.0))
        self._saved_step = step
        return path

    def _maybe_resume(self, resume_from_checkpoint) -> int:
        from deepgen_rl.checkpoints.training_state import (find_resume_checkpoint, load_training_checkpoint,
                                                           truncate_metrics)

        path = find_resume_checkpoint(self.args.output_dir, resume_from_checkpoint)
        step = 0 if path is None else load_training_checkpoint(self._state_view(), path)
        if path is not None:
            self.state.global_step = step
        self._saved_step = step  # the weights of `step` are on disk (in `path`) or there is nothing to save yet
        self.counters_at_start = dict(self.counters)  # this run's own updates = counters - these
        if self.rank == 0:
            truncate_metrics(self.args.output_dir, step)  # steps after `step` are redone: never logged twice
        return step

