"""Shared helpers of the trainer tests: tiny GRPO arguments and in-process training runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

from transformers import HfArgumentParser

from deepgen_rl.config import GRPOConfig
from deepgen_rl.services.ocr.launch import free_port

ROOT = Path(__file__).resolve().parents[2]
TINY_CONFIG = str(ROOT / "configs/models/deepgen_tiny.py")
DEMO_PROGRAMMATIC = str(ROOT / "assets/rl_datasets/demo/demo_programmatic.yaml")

TINY_ARGS = {
    "rollout_n": 4, "rollout_micro_batch_size": 8, "atrain_micro_batch_size": 8, "num_inference_steps": 4,
    "image_height": 32, "image_width": 32, "save_steps": 1000, "log_images_every": 0, "report_to": "none",
    "sftaux_coef": 0.0, "disable_tqdm": True, "learning_rate": 1e-3, "beta": 0.0, "seed": 1,
    # pre-recipe defaults these tests were written against (the recipe's are 20, 1.0, true, 32, 0.1)
    "warmup_steps": 0, "sde_eta": 0.7, "init_same_noise": False, "sftaux_micro_batch_size": 4, "diffusionnft_beta": 1.0,
}


def make_args(output_dir, **overrides) -> GRPOConfig:
    values = {**TINY_ARGS, **overrides, "output_dir": str(output_dir)}
    argv = []
    for k, v in values.items():
        argv += [f"--{k}", json.dumps(v) if isinstance(v, (dict, list)) else str(v)]
    (args,) = HfArgumentParser((GRPOConfig,)).parse_args_into_dataclasses(args=argv)
    return args


def tiny_model():
    from deepgen_rl.models import build_model

    return build_model(TINY_CONFIG)


def run_inprocess(tmp_path, *, dataset_config=DEMO_PROGRAMMATIC, rewards=None, model=None, **overrides):
    from deepgen_rl.trainer.grpo_trainer import DeepGenGRPOTrainer

    args = make_args(tmp_path, **overrides)
    trainer = DeepGenGRPOTrainer(model or tiny_model(), args, dataset_config=dataset_config, rewards=rewards)
    history = trainer.train(resume_from_checkpoint=False)
    return trainer, history


def subprocess_env(**extra) -> dict:
    env = dict(os.environ)
    env.update({"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
    env.update({k: str(v) for k, v in extra.items()})
    return env



def _default_interrupt_signals() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


def train_sh(output_dir, *extra: str, ngpus: int | None = None, deepspeed: str = "", eval_config: str = "",
             sftaux_config: str = "", dataset_config: str = DEMO_PROGRAMMATIC, timeout: int = 600,
             check: bool = True, env_extra: dict | None = None, popen: bool = False):
    """Run ``bash scripts/train.sh`` on the tiny model with tiny settings (plus ``extra`` CLI args)."""
    env = subprocess_env(MODEL_CONFIG=TINY_CONFIG, DATASET_CONFIG=dataset_config, EVAL_DATASET_CONFIG=eval_config,
                         SFTAUX_DATASET_CONFIG=sftaux_config, DEEPSPEED_CONFIG=deepspeed, OUTPUT_DIR=output_dir,
                         REPORT_TO="none", MASTER_PORT=free_port(), **(env_extra or {}))
    if ngpus:
        env["NGPUS"] = str(ngpus)
    else:
        env.pop("NGPUS", None)
    args = []
    for k, v in TINY_ARGS.items():
        if k not in ("report_to",):
            args += [f"--{k}", str(v)]
    cmd = ["bash", str(ROOT / "scripts/train.sh"), *args, *extra]
    if popen:
        # SIGINT back to its default in the run: a suite started as a background job of a non-interactive shell
        # inherits SIGINT (and SIGQUIT) ignored, and an ignored signal stays ignored across exec, so the Ctrl-C tests
        # would wait for a signal the run can never receive (measured: 30 s, then killed).
        return subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True, preexec_fn=_default_interrupt_signals)
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"train.sh failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}")
    return proc


def read_metrics(output_dir) -> list[dict]:
    path = Path(output_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
