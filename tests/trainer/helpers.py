"""Shared helpers of the trainer tests: tiny GRPO arguments and in-process training runs."""

from __future__ import annotations

import json
import os
from pathlib import Path

from transformers import HfArgumentParser

from deepgen_rl.config import GRPOConfig

ROOT = Path(__file__).resolve().parents[2]
TINY_CONFIG = str(ROOT / "configs/models/deepgen_tiny.py")
DEMO_PROGRAMMATIC = str(ROOT / "assets/rl_datasets/demo/demo_programmatic.yaml")

TINY_ARGS = {
    "rollout_n": 4, "rollout_micro_batch_size": 8, "atrain_micro_batch_size": 8, "num_inference_steps": 4,
    "image_height": 32, "image_width": 32, "save_steps": 1000, "log_images_every": 0, "report_to": "none",
    "sftaux_coef": 0.0, "disable_tqdm": True, "learning_rate": 1e-3, "beta": 0.0, "seed": 1,
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
