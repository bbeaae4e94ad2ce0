"""Command-line arguments of ``python -m deepgen_rl.grpo_deepgen`` (parsed with ``HfArgumentParser``).

Defaults are the DeepGen-RL recipe (docs/recipe.md: every flag of the original, its default and ours). Every boolean can be switched both ways
(``--flag true|false``; ``--no_flag`` for those defaulting to true). No environment variable changes the math.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field, fields

from transformers import TrainingArguments

from deepgen_rl.rl.advantages import ADV_TYPES
from deepgen_rl.rl.losses import KL_TYPES
from deepgen_rl.rl.objectives import OBJECTIVE_NAMES, OBJECTIVES
from deepgen_rl.rl.samplers import DEFAULT_SDE_ETA, DEFAULT_SDE_SAMPLER, SDE_SAMPLERS

# Every option list is imported from the module that defines the choice (one home each); a field below names it
# in its metadata "choices", so --help lists them, argparse rejects a bad value at parse time and __post_init__
# checks configs built in code.
# float flags that must be finite (a NaN passes every ">" check and poisons the run silently)
FINITE_FLOATS = ("learning_rate", "weight_decay", "max_grad_norm", "cfg_scale", "sde_eta", "beta",
                 "clip_range", "adv_clip_max", "timestep_fraction", "diffusionnft_beta", "ema_decay", "sftaux_coef",
                 "save_steps", "logging_steps", "debug_checkpoint_delay_s", "max_train_minutes",
                 "max_train_minutes_from")


@dataclass
class ModelArguments:
    model_config: str = field(
        default="configs/models/deepgen_sd35m_qwen25vl3b.py",
        metadata={"help": "mmengine model config (.py); configs/models/deepgen_tiny.py builds a tiny CPU model"})
    checkpoint: str | None = field(
        default=None, metadata={"help": "DeepGen SFT checkpoint (.pth) or an RL checkpoint dir to start from"})


@dataclass
class DataArguments:
    dataset_config: str = field(
        default="assets/rl_datasets/deepgen/deepgen_train.yaml", metadata={"help": "training dataset YAML"})
    eval_dataset_config: str | None = field(
        default=None, metadata={"help": "evaluation dataset YAML (UniGenBench); empty/None disables evaluation"})
    sftaux_dataset_config: str | None = field(
        default=None, metadata={"help": "mmengine config of the SFT-auxiliary image-caption data"})


@dataclass
class GRPOConfig(TrainingArguments):
    # ---- HF defaults changed to the seed recipe ----
    output_dir: str = field(default="outputs/deepgen_rl", metadata={"help": "where checkpoints/logs/images go"})
    learning_rate: float = field(default=2e-6, metadata={"help": "AdamW learning rate for the DiT"})
    lr_scheduler_type: str = field(default="constant_with_warmup", metadata={"help": "HF LR schedule"})
    warmup_steps: float = field(
        default=20, metadata={"help": "LR warm-up optimizer steps (the recipe's 20; >= 1 is a count, < 1 a ratio)"})
    gradient_checkpointing: bool = field(default=True, metadata={"help": "activation checkpointing in the DiT"})
    max_train_minutes: float = field(default=0.0, metadata={
        "help": ">0: a wall-clock budget. Training stops before a step that, with an eval after it, would end after "
                "this many minutes from the start of training in this process or from --max_train_minutes_from (the "
                "step-0 eval included; a resumed run gets the whole budget again; a step's time is estimated as the "
                "mean of the last 5 without their evals, an eval's as the longest timed, when --eval_freq > 0), then "
                "evaluates and saves as at --max_steps, which stays the cap. The ranks stop together. 0 = no budget"})
    max_train_minutes_from: float = field(default=0.0, metadata={
        "help": "Unix time (seconds) that --max_train_minutes counts from, e.g. a launch script's start, so that the "
                "budget covers start-up too; 0 = the start of training in this process"})
    cpu_fast_gelu: bool = field(default=False, metadata={
        "help": "compute the DiT's tanh GELUs of CPU tensors as x*sigmoid(2u) (the same function to float rounding; "
                "~3x faster than ATen's on an AVX2 CPU: a toy-DiT forward takes 0.9x the time); CUDA tensors are "
                "untouched"})
    logging_steps: float = field(default=1, metadata={"help": "log every N steps"})
    save_steps: float = field(default=50, metadata={"help": "write checkpoint-N/ every N steps"})
    remove_unused_columns: bool = field(default=False, metadata={"help": "unused by the GRPO trainer"})
    # ---- rollout ----
    rollout_n: int = field(default=8, metadata={"help": "images per prompt (GRPO group size)"})
    rollout_micro_batch_size: int = field(default=32, metadata={"help": "images per rank per rollout forward"})
    rollout_global_batch_size: int | None = field(
        default=None, metadata={"help": "images per step over all ranks (default: rollout_micro_batch_size x ranks)"})
    num_inference_steps: int = field(default=50, metadata={"help": "denoising steps T of a rollout"})
    image_height: int = field(default=512, metadata={"help": "generated image height"})
    image_width: int = field(default=512, metadata={"help": "generated image width"})
    cfg_scale: float = field(default=0.0, metadata={"help": "rollout CFG scale; <= 1 means conditional only"})
    init_same_noise: bool = field(default=True, metadata={"help": "images of one prompt share the initial noise"})
    share_ode_prefix: bool = field(default=True, metadata={
        "help": "with --init_same_noise, run the ODE steps before the first stochastic step (an SDE window that "
                "starts late) once per group instead of once per image: the same images up to float rounding, "
                "fewer DiT forwards"})
    reuse_last_velocity: bool = field(default=False, metadata={
        "help": "rollouts: when the last step (sigma_{T-1} -> 0) is an ODE step, take it with the velocity of step "
                "T-2 instead of one more DiT forward (diffusers' shifted schedule ends at a tiny sigma_{T-1}: 0.009 "
                "at 8 steps, shift 3); one DiT forward per image fewer, no trained step changed, final images "
                "nearly the same. Needs --sde_window_size > 0 (a window always ends before the last step). Off in "
                "the recipe"})
    trajectory_device: str = field(default="cpu", metadata={"help": "where rollout latents are kept: cpu or device"})
    # ---- policy update ----
    atrain_micro_batch_size: int = field(default=32, metadata={"help": "images per rank per training forward"})
    atrain_num_actor_update_steps: int = field(
        default=1, metadata={"help": "optimizer updates per rollout batch (each over all trained timesteps)"})
    atrain_sde_sampler: str = field(default=DEFAULT_SDE_SAMPLER, metadata={
        "help": "SDE sampler of the rollout and the training log-probs", "choices": SDE_SAMPLERS})
    sde_eta: float = field(default=DEFAULT_SDE_ETA, metadata={
        "help": f"noise level eta of the SDE sampler (recipe: {DEFAULT_SDE_ETA})"})
    atrain_adv_type: str = field(default="gdpo", metadata={"help": "advantage type", "choices": ADV_TYPES})
    atrain_kl_type: str = field(default="v-based", metadata={"help": "KL form of the beta term", "choices": KL_TYPES})
    atrain_algorithm: str = field(default="flowgrpo", metadata={
        "help": "policy objective (deepgen_rl/rl/objectives.py)", "choices": OBJECTIVE_NAMES})
    beta: float = field(default=5e-7, metadata={"help": "KL coefficient (0 disables the reference model)"})
    clip_range: float = field(default=1e-4, metadata={"help": "PPO clip range c (ratio clipped to [1-c, 1+c])"})
    adv_clip_max: float = field(default=5.0, metadata={"help": "advantages are clamped to +-adv_clip_max"})
    timestep_fraction: float = field(default=0.6, metadata={"help": "fraction of the T steps trained per image"})
    sde_window_size: int = field(
        default=0, metadata={"help": ">0: only a window of this many steps is stochastic and trained (Flow-GRPO-Fast)"})
    sde_window_range: str = field(
        default="", metadata={"help": "'lo,hi' range of window start steps (default 0..T-1-window)"})
    diffusionnft_beta: float = field(
        default=0.1, metadata={"help": "DiffusionNFT mixing coefficient beta (v+ = beta v_theta + (1-beta) v_old)"})
    negate_advantages: bool = field(
        default=False, metadata={"help": "sanity check only: train on -A (the reward must then fall)"})
    skip_zero_advantage: bool = field(default=False, metadata={
        "help": "leave images with |A| <= --zero_advantage_tol out of the policy update's forwards (the same "
                "gradient up to their |A| for flowgrpo/grpoguard with --beta 0; refused otherwise)"})
    zero_advantage_tol: float = field(
        default=1e-6, metadata={"help": "|A| at or below which --skip_zero_advantage leaves an image out"})
    ema_decay: float = field(default=0.0, metadata={"help": "EMA decay of the DiT weights (0 = no EMA)"})
    # ---- rewards ----
    reward_kwargs: str = field(
        default="{}", metadata={"help": "JSON object {reward_name: {kwarg: value}} passed to get_reward"})
    reward_workers: int = field(default=4, metadata={"help": "threads computing rewards while rollout continues"})
    # ---- SFT auxiliary ----
    sftaux_coef: float = field(default=1e-4, metadata={"help": "lambda: loss = (1-lambda) L_grpo + lambda L_sft"})
    sftaux_every_n_steps: int = field(default=1, metadata={"help": "add the SFT loss every N optimizer updates"})
    sftaux_micro_batch_size: int = field(default=32, metadata={"help": "image-caption pairs per rank per SFT loss"})
    sftaux_latent_cache_mb: float = field(default=1024.0, metadata={
        "help": "MiB per rank of SFT-image VAE latents kept and reused when an image is drawn again (the frozen VAE's "
                "posterior mean: the same x0 up to float rounding); 0 = encode every batch"})
    # ---- evaluation / logging ----
    eval_freq: int = field(default=10, metadata={"help": "evaluate every N steps (0 = never)"})
    eval_inference_mode: str = field(default="ode", metadata={"help": "ode or sde sampling for evaluation"})
    eval_max_prompts: int = field(default=0, metadata={"help": ">0: evaluate only the first N prompts per dataset"})
    eval_judge: bool = field(default=True, metadata={"help": "score eval images with the UniGenBench judge"})
    eval_at_start: bool = field(default=False, metadata={"help": "also evaluate before the first step"})
    log_images_every: int = field(default=1, metadata={"help": "log a sample grid every N steps (0 = never)"})
    save_rollout_records: bool = field(
        default=False, metadata={"help": "write OUTPUT_DIR/rollouts/step_N/rank_R.jsonl (rewards, groups, advantages)"})
    auto_resume: bool = field(
        default=True, metadata={"help": "resume from the newest complete checkpoint in output_dir if there is one"})
    debug_checkpoint_delay_s: float = field(
        default=0.0, metadata={"help": "testing only: sleep while a checkpoint is half written"})
    overwrite_output_dir: bool = field(
        default=False, metadata={"help": "with --no_auto_resume: move another run's checkpoints in output_dir aside "
                                         "(into previous_run_<time>/) instead of refusing to start"})

    def __post_init__(self):
        # DeepSpeed is driven by the GRPO trainer itself (explicit accumulation boundary, one step per rollout), so
        # the path is taken out of HF's hands: HF would otherwise build an accelerate DeepSpeed plugin and make
        # from_pretrained partition the frozen VLM under ZeRO-3.
        self.deepspeed_config = self.deepspeed
        self.deepspeed = None
        if isinstance(self.report_to, str) and "," in self.report_to:  # the seed's "--report_to wandb,swanlab"
            self.report_to = [x.strip() for x in self.report_to.split(",") if x.strip()]
        super().__post_init__()
        for f in fields(self):  # our fields' "choices" (argparse enforces them too), for configs built in code
            choices = f.metadata.get("choices") if f.name in GRPOConfig.__annotations__ else None
            if choices is not None and getattr(self, f.name) not in choices:
                raise ValueError(f"--{f.name} must be one of {tuple(choices)}, got {getattr(self, f.name)!r}")
        if OBJECTIVES[self.atrain_algorithm].single_update_only and self.atrain_num_actor_update_steps != 1:
            raise ValueError(f"--atrain_algorithm {self.atrain_algorithm} needs --atrain_num_actor_update_steps 1 "
                             "(its old-policy terms are taken from the weights that sampled the rollout)")
        for name in FINITE_FLOATS:
            value = getattr(self, name)
            if value is not None and not math.isfinite(float(value)):
                raise ValueError(f"--{name} must be a finite number, got {value}")
        from deepgen_rl.rl.samplers import check_eta

        try:
            check_eta(self.atrain_sde_sampler, self.sde_eta)
        except ValueError as e:
            raise ValueError(f"--sde_eta {self.sde_eta} is invalid for --atrain_sde_sampler "
                             f"{self.atrain_sde_sampler}: {e}") from None
        if not self.learning_rate > 0:
            raise ValueError(f"--learning_rate must be > 0, got {self.learning_rate}")
        if not self.clip_range > 0 or not self.adv_clip_max > 0:
            raise ValueError("--clip_range and --adv_clip_max must be > 0")
        if self.max_train_minutes < 0:
            raise ValueError(f"--max_train_minutes must be >= 0 (0 = no budget), got {self.max_train_minutes}")
        if self.max_train_minutes_from < 0 or self.max_train_minutes_from > time.time() + 1.0:
            raise ValueError("--max_train_minutes_from must be a Unix time in seconds, not in the future (0 = the "
                             f"start of training), got {self.max_train_minutes_from}")
        if self.sde_window_size < 0:
            raise ValueError("--sde_window_size must be >= 0")
        window_range = self.window_range()  # validates the 'lo,hi' format
        if self.sde_window_size > 0:
            lo, hi = window_range or (0, self.num_inference_steps - 1)
            if not (0 <= lo and hi <= self.num_inference_steps - 1 and hi - lo >= self.sde_window_size):
                raise ValueError(f"--sde_window_size {self.sde_window_size} does not fit in --sde_window_range "
                                 f"[{lo}, {hi}) of the {self.num_inference_steps} steps (the last step is never "
                                 "stochastic-trained)")
        if self.reuse_last_velocity and self.sde_window_size == 0:
            raise ValueError("--reuse_last_velocity needs an SDE window (--sde_window_size > 0): without one every "
                             "rollout step is stochastic, the last one too, so no ODE step could reuse a velocity")
        if self.eval_inference_mode not in ("ode", "sde"):
            raise ValueError("--eval_inference_mode must be ode or sde")
        if self.trajectory_device not in ("cpu", "device"):
            raise ValueError("--trajectory_device must be cpu or device")
        if not 0.0 < self.timestep_fraction <= 1.0:
            raise ValueError("--timestep_fraction must be in (0, 1]")
        if not 0.0 <= self.ema_decay < 1.0:
            raise ValueError("--ema_decay must be in [0, 1)")
        if self.skip_zero_advantage:
            if self.atrain_algorithm == "diffusionnft" or self.beta > 0:
                raise ValueError(
                    "--skip_zero_advantage needs --beta 0 and a clipped-ratio objective (flowgrpo, grpoguard): "
                    f"with --beta {self.beta} / --atrain_algorithm {self.atrain_algorithm} an image with A = 0 "
                    "still has a gradient (the KL term / DiffusionNFT's 0.5 reward), so skipping it would change "
                    "the update")
            if not 0.0 <= self.zero_advantage_tol < 1e-2:
                raise ValueError(f"--zero_advantage_tol must be in [0, 0.01), got {self.zero_advantage_tol}")
        if self.sftaux_latent_cache_mb < 0:
            raise ValueError(f"--sftaux_latent_cache_mb must be >= 0, got {self.sftaux_latent_cache_mb}")
        if self.beta < 0 or not 0.0 <= self.sftaux_coef < 1.0:
            raise ValueError("--beta must be >= 0 and --sftaux_coef in [0, 1)")
        for name in ("rollout_n", "rollout_micro_batch_size", "atrain_micro_batch_size", "num_inference_steps",
                     "atrain_num_actor_update_steps", "sftaux_every_n_steps", "sftaux_micro_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name} must be >= 1")
        if self.image_height % 16 or self.image_width % 16 or self.image_height < 16 or self.image_width < 16:
            raise ValueError(f"--image_height/--image_width must be positive multiples of 16 (VAE x8, DiT patch 2), "
                             f"got {self.image_height}x{self.image_width}")
        if self.rollout_n < 2:
            raise ValueError(f"--rollout_n must be >= 2, got {self.rollout_n}: GRPO advantages compare the images of "
                             "one prompt, so a group of one gives every image advantage 0 and trains nothing")
        if self.num_inference_steps < 2:
            raise ValueError(f"--num_inference_steps must be >= 2, got {self.num_inference_steps}: the last "
                             "denoising step is never stochastic, so with one step no step is trained")
        try:
            kwargs = json.loads(self.reward_kwargs or "{}")
        except json.JSONDecodeError as e:
            raise ValueError(f"--reward_kwargs is not valid JSON: {e}") from e
        if not isinstance(kwargs, dict) or not all(isinstance(v, dict) for v in kwargs.values()):
            raise ValueError("--reward_kwargs must be a JSON object of objects: {\"reward\": {\"kwarg\": value}}")
        self.reward_kwargs_dict = kwargs

    def window_range(self) -> tuple[int, int] | None:
        if not self.sde_window_range:
            return None
        parts = self.sde_window_range.split(",")
        try:
            lo, hi = (int(x) for x in parts)
        except ValueError:
            raise ValueError(f"--sde_window_range must be 'lo,hi' (two integers), got {self.sde_window_range!r}") from None
        return lo, hi


def batch_layout(args: GRPOConfig, world_size: int) -> dict:
    """Images/prompts per rank and globally; raises a readable ValueError when they do not divide."""
    global_images = args.rollout_global_batch_size or args.rollout_micro_batch_size * world_size
    layout = {
        "world_size": world_size, "rollout_n": args.rollout_n, "global_images": global_images,
        "images_per_rank": global_images // world_size if world_size else 0,
    }
    layout["prompts_per_rank"] = layout["images_per_rank"] // args.rollout_n
    layout["global_prompts"] = layout["prompts_per_rank"] * world_size

    def explain(problem: str) -> ValueError:
        return ValueError(
            f"invalid batch layout: {problem}\n"
            f"  ranks={world_size}  rollout_n={args.rollout_n} images/prompt\n"
            f"  global: {global_images} images/step (--rollout_global_batch_size "
            f"{args.rollout_global_batch_size or 'unset -> rollout_micro_batch_size x ranks'})\n"
            f"  per rank: {global_images / world_size:g} images = {global_images / world_size / args.rollout_n:g} "
            f"prompts; rollout micro-batch {args.rollout_micro_batch_size}, train micro-batch "
            f"{args.atrain_micro_batch_size}\n"
            f"  need: global images divisible by ranks x rollout_n ({world_size * args.rollout_n})")

    if global_images % (world_size * args.rollout_n):
        raise explain(f"{global_images} images cannot be split into whole prompt groups on {world_size} rank(s)")
    return layout
