"""GRPO step anatomy on CPU: the real trainer's step vs the same model calls run bare, interleaved in one process.

    OMP_NUM_THREADS=1 python bench/step_anatomy.py [--preset small] [--image-size 128] [--steps 5] [--warmup 1]
                                                   [--images 8] [--rollout-n 4] [--rollout-mb 4] [--train-mb 4]
                                                   [--num-inference-steps 6] [--timestep-fraction 0.5]
                                                   [--gradient-checkpointing] [--threads 1] [--smoke]

The trainer (``DeepGenGRPOTrainer.train`` on the demo prompts with the ``brightness`` reward) and a hand-written
loop share ONE model. After every trainer step (a ``TrainerCallback.on_step_end``) the bare loop runs one step of
the same work, so both see the same machine load:

  bare step = encode the unique prompts once (VLM + connector); per rollout micro-batch: T x (DiT forward +
              ``sde_step``) storing the trajectory, VAE decode; then for each (train micro-batch, trained timestep)
              one DiT forward + ``sde_step(prev_sample=...)`` + backward of a ratio loss with the same shapes; one
              gradient clip + AdamW step.

The trainer step time is the wall time of its whole loop iteration (sampling prompts, rollout, reward threads,
advantages, update, metrics, ``log``, ``metrics.jsonl``), the end of the previous callback to the next
``on_step_end``. Medians over ``--steps`` steps after ``--warmup``. Phase times come from the trainer's own
metrics (``time/rollout_s``, ``time/reward_wait_s``, ``time/update_s``, ``time/step_s``).
Framework overhead ratio = trainer step / bare step (target <= 1.10x).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (DEMO_PROGRAMMATIC, TINY_CONFIG, load_note, median, print_ratio, print_rerun,  # noqa: E402
                     print_table, setup_env)

TARGET = "<= 1.10"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="small", choices=["tiny", "small"], help="tiny model preset (models/tiny.py)")
    p.add_argument("--image-size", type=int, default=128, help="square image side in pixels")
    p.add_argument("--images", type=int, default=8, help="images per step (rollout_global_batch_size, 1 rank)")
    p.add_argument("--rollout-n", type=int, default=4, help="images per prompt")
    p.add_argument("--rollout-mb", type=int, default=4, help="rollout_micro_batch_size")
    p.add_argument("--train-mb", type=int, default=4, help="atrain_micro_batch_size")
    p.add_argument("--num-inference-steps", type=int, default=6, help="denoising steps T")
    p.add_argument("--timestep-fraction", type=float, default=0.5, help="fraction of the T steps trained")
    p.add_argument("--gradient-checkpointing", action="store_true", help="activation checkpointing (both loops)")
    p.add_argument("--steps", type=int, default=5, help="measured steps (each: one trainer + one bare step)")
    p.add_argument("--warmup", type=int, default=1, help="discarded steps of each loop first")
    p.add_argument("--threads", type=int, default=1,
                   help="torch intra-op threads (OMP_NUM_THREADS); 1 is stable on a shared, loaded machine")
    p.add_argument("--smoke", action="store_true", help="tiny preset, 32 px, T=2, one measured step (seconds)")
    args = p.parse_args(argv)
    if args.smoke:
        args.preset, args.image_size, args.images, args.rollout_n = "tiny", 32, 4, 2
        args.rollout_mb, args.train_mb, args.num_inference_steps, args.timestep_fraction = 2, 2, 2, 0.6
        args.steps, args.warmup = 1, 1
    return args


def grpo_config(args, output_dir):
    from transformers import HfArgumentParser

    from deepgen_rl.config import GRPOConfig

    values = {
        "output_dir": output_dir, "rollout_n": args.rollout_n, "rollout_micro_batch_size": args.rollout_mb,
        "rollout_global_batch_size": args.images, "atrain_micro_batch_size": args.train_mb,
        "num_inference_steps": args.num_inference_steps, "timestep_fraction": args.timestep_fraction,
        "image_height": args.image_size, "image_width": args.image_size, "max_steps": args.warmup + args.steps,
        "save_steps": 100000, "log_images_every": 0, "report_to": "none", "sftaux_coef": 0.0, "beta": 0.0,
        "disable_tqdm": True, "learning_rate": 1e-5, "seed": 1, "eval_freq": 0, "reward_workers": 4,
        "gradient_checkpointing": args.gradient_checkpointing, "auto_resume": False,
    }
    argv = [x for k, v in values.items() for x in (f"--{k}", str(v))]
    (cfg,) = HfArgumentParser((GRPOConfig,)).parse_args_into_dataclasses(args=argv)
    return cfg


class BareStep:
    """The trainer's model work without the trainer (see the module docstring). ``__call__`` -> phase seconds."""

    def __init__(self, model, cfg, prompts: list[str]):
        import torch

        from deepgen_rl.rl.samplers import make_sigmas, trained_step_indices

        self.model, self.cfg, self.prompts = model, cfg, prompts
        self.params = [p for p in model.transformer.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.learning_rate)
        self.sigmas = make_sigmas(cfg.num_inference_steps, model.scheduler_shift)
        self.trained = trained_step_indices(cfg.num_inference_steps, timestep_fraction=cfg.timestep_fraction,
                                            generator=torch.Generator().manual_seed(0))

    def __call__(self) -> dict[str, float]:
        import torch

        from deepgen_rl.rl.samplers import sde_step

        cfg, model, dit = self.cfg, self.model, self.model.transformer
        n, T, sig = cfg.rollout_global_batch_size, cfg.num_inference_steps, self.sigmas
        t0 = time.perf_counter()
        dit.eval()
        with torch.no_grad():
            cond = model.encode_prompts(self.prompts)
            cond_index = torch.arange(n) // cfg.rollout_n
            c, h, w = model.latent_shape(cfg.image_height, cfg.image_width)
            traj = torch.empty((n, T + 1, c, h, w))
            log_probs = torch.zeros((n, T))
            for s in range(0, n, cfg.rollout_micro_batch_size):
                idx = torch.arange(s, min(s + cfg.rollout_micro_batch_size, n))
                x = torch.randn((len(idx), c, h, w))
                mb_cond = cond.index_select(cond_index[idx])
                traj[idx, 0] = x
                for t in range(T):
                    v = model.predict_velocity(x, torch.full((len(idx),), float(sig[t])), mb_cond)
                    out = sde_step(cfg.atrain_sde_sampler, v, x, float(sig[t]), float(sig[t + 1]), cfg.sde_eta)
                    x = out.prev_sample
                    traj[idx, t + 1] = x
                    log_probs[idx, t] = out.log_prob
                model.decode_latents(x)
        t1 = time.perf_counter()

        dit.train()
        adv = torch.randn(n)
        for s in range(0, n, cfg.atrain_micro_batch_size):
            idx = torch.arange(s, min(s + cfg.atrain_micro_batch_size, n))
            mb_cond = cond.index_select(cond_index[idx])
            for j in self.trained:
                x, x_next = traj[idx, j], traj[idx, j + 1]
                v = model.predict_velocity(x, torch.full((len(idx),), float(sig[j])), mb_cond)
                out = sde_step(cfg.atrain_sde_sampler, v, x, float(sig[j]), float(sig[j + 1]), cfg.sde_eta,
                               prev_sample=x_next)
                ratio = torch.exp(out.log_prob - log_probs[idx, j])
                loss = -(adv[idx] * ratio).mean() * len(idx) / n / len(self.trained)
                loss.backward()
        torch.nn.utils.clip_grad_norm_(self.params, cfg.max_grad_norm or float("inf"))
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        t2 = time.perf_counter()
        return {"rollout": t1 - t0, "update": t2 - t1, "total": t2 - t0}


def make_interleave_callback(bare: BareStep):
    from transformers import TrainerCallback

    class Interleave(TrainerCallback):
        """After each trainer step: record its loop time, run one bare step, restart the trainer clock."""

        def __init__(self):
            self.trainer_s: list[float] = []
            self.bare: list[dict] = []
            self.resume = None

        def on_train_begin(self, args, state, control, **kwargs):
            self.resume = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            self.trainer_s.append(time.perf_counter() - self.resume)
            self.bare.append(bare())
            self.resume = time.perf_counter()

    return Interleave()


def main(argv=None) -> int:
    args = parse_args(argv)
    setup_env(args.threads)
    import torch
    from transformers.trainer_callback import PrinterCallback
    from transformers.utils import logging as hf_logging

    from deepgen_rl.models import build_model
    from deepgen_rl.trainer.grpo_trainer import DeepGenGRPOTrainer

    hf_logging.set_verbosity_error()
    torch.manual_seed(0)
    model = build_model(TINY_CONFIG, tiny_preset=args.preset)
    dit_params = sum(p.numel() for p in model.transformer.parameters())
    with tempfile.TemporaryDirectory(prefix="bench_step_anatomy_") as out_dir:
        cfg = grpo_config(args, out_dir)
        prompts_per_step = args.images // args.rollout_n
        lines = (Path(DEMO_PROGRAMMATIC).parent / "demo_general_prompts.txt").read_text().splitlines()
        prompts = [line for line in lines if line.strip()][:prompts_per_step]  # same file the trainer samples
        bare = BareStep(model, cfg, prompts)
        callback = make_interleave_callback(bare)
        trainer = DeepGenGRPOTrainer(model, cfg, dataset_config=DEMO_PROGRAMMATIC, callbacks=[callback])
        trainer.remove_callback(PrinterCallback)  # the per-step log dict on stdout would bury the table
        load_before = load_note()
        history = trainer.train(resume_from_checkpoint=False)
        load_after = load_note()

    w = args.warmup
    hist = history[w:]
    tr_step = median(callback.trainer_s[w:])
    bare_rows = callback.bare[w:]
    tr = {k: median(h[f"time/{k}_s"] for h in hist) for k in ("rollout", "reward_wait", "update", "step")}
    tr_rest = median(s - h["time/step_s"] for s, h in zip(callback.trainer_s[w:], hist))
    br = {k: median(b[k] for b in bare_rows) for k in ("rollout", "update", "total")}

    T = args.num_inference_steps
    n_trained = len(bare.trained)
    print(f"\nGRPO step anatomy: preset {args.preset!r} ({dit_params / 1e6:.1f} M DiT params), "
          f"{args.image_size}x{args.image_size} px, {args.images} images/step = {prompts_per_step} prompts x "
          f"{args.rollout_n}, rollout micro-batch {args.rollout_mb}, train micro-batch {args.train_mb}, T={T}, "
          f"{n_trained} trained timesteps, gradient checkpointing {'on' if args.gradient_checkpointing else 'off'}, "
          f"reward brightness, {args.threads} torch threads, fp32 CPU")
    print(f"medians over {len(hist)} step(s) after {w} warm-up step(s), trainer and bare steps interleaved; "
          f"{load_before} (before) / {load_after} (after)")
    # shares: sum of a phase over the measured steps / sum of the loop times (adds up to 100%)
    loop_total = sum(callback.trainer_s[w:])
    phase_sum = {k: sum(h[f"time/{k}_s"] for h in hist) for k in ("rollout", "reward_wait", "update", "step")}
    phase_sum["rest"] = loop_total - phase_sum["step"]
    share = lambda k: f"{100 * phase_sum[k] / loop_total:.1f}%"  # noqa: E731
    rows = [
        ["rollout (encode + T x DiT/sde_step + decode)", tr["rollout"], br["rollout"], tr["rollout"] / br["rollout"],
         share("rollout")],
        ["reward wait (after the rollout)", tr["reward_wait"], 0.0, float("nan"), share("reward_wait")],
        ["update (fwd+bwd per trained step, 1 opt step)", tr["update"], br["update"], tr["update"] / br["update"],
         share("update")],
        ["loop rest (advantages, metrics, log, jsonl)", tr_rest, 0.0, float("nan"), share("rest")],
        ["whole step", tr_step, br["total"], tr_step / br["total"], "100.0%"],
    ]
    print_table("seconds per step (median)", ["phase", "trainer s", "bare s", "trainer/bare", "share of trainer"],
                rows, ["", ".3f", ".3f", ".3f", ""])
    print(f"\ntrainer images/s: {args.images / tr_step:.2f}   bare images/s: {args.images / br['total']:.2f}   "
          f"DiT forwards/step: {args.images // args.rollout_mb * T} rollout (batch {args.rollout_mb}) + "
          f"{-(-args.images // args.train_mb) * n_trained} train fwd+bwd (batch {args.train_mb})")
    print_ratio("framework_overhead (trainer step / bare step)", tr_step / br["total"], TARGET)
    print_ratio("rollout (trainer / bare)", tr["rollout"] / br["rollout"])
    print_ratio("update (trainer / bare)", tr["update"] / br["update"])
    print_rerun(__file__, threads=args.threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
