"""End to end through ``bash scripts/train.sh`` with the tiny model on the CPU (single process)."""

from __future__ import annotations

import json
import math

import pytest
from PIL import Image
from safetensors.torch import load_file

from tests.trainer.helpers import ROOT, read_metrics, train_sh


@pytest.mark.slow
def test_train_sh_two_steps(tmp_path):
    out = tmp_path / "run"
    train_sh(out, "--max_steps", "2", "--save_steps", "2", "--log_images_every", "1", "--sftaux_coef", "1e-4",
             "--sftaux_micro_batch_size", "2", sftaux_config=str(ROOT / "assets/sftaux/demo.py"))
    ckpt = out / "checkpoint-2"
    meta = json.loads((ckpt / "checkpoint_meta.json").read_text())
    assert meta["global_step"] == 2 and meta["format"] == "deepgen_rl.checkpoint.v1"
    weights = load_file(str(ckpt / "dit.safetensors"))
    assert weights and all(v.dtype.is_floating_point for v in weights.values())
    for f in ("optimizer.pt", "scheduler.pt", "sampler_state.json", "trainer_state.json", "rng_state_rank0.pt",
              "sftaux_state.pt", "training_args.json", "configs/model_config.py", "configs/dataset_config.yaml"):
        assert (ckpt / f).is_file(), f
    metrics = read_metrics(out)
    assert len(metrics) == 2
    for m in metrics:
        assert math.isfinite(m["reward/total"]) and 0.0 <= m["reward/brightness"] <= 1.0
        assert math.isfinite(m["train/sft_loss"]) and m["train/sft_loss"] > 0
    assert [m["train/optimizer_steps"] for m in metrics] == [1.0, 2.0]
    for step in (1, 2):
        with Image.open(out / "samples" / f"step_{step}.png") as im:
            im.verify()
    log = (out / "logs" / "0.log").read_text()
    assert "saved" in log and "checkpoint-2" in log
    assert (out / "configs" / "demo_programmatic.yaml").is_file()


def test_missing_model_path_is_a_clear_error(tmp_path):
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.endswith("_MODEL_NAME_OR_PATH")}
    env["HF_HUB_OFFLINE"] = "1"
    proc = subprocess.run([sys.executable, "-m", "deepgen_rl.grpo_deepgen", "--output_dir", str(tmp_path / "o"),
                           "--max_steps", "1"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert "QWEN2_5_VL_MODEL_NAME_OR_PATH is not set" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_missing_prompt_file_is_named(tmp_path):
    (tmp_path / "m.yaml").write_text("datasets:\n  - name: a\n    path: nowhere.txt\n    rewards:\n      - brightness: 1\n")
    proc = train_sh(tmp_path / "run", "--max_steps", "1", dataset_config=str(tmp_path / "m.yaml"), check=False)
    assert proc.returncode != 0
    assert "nowhere.txt" in proc.stderr and "1 prompt file(s) not found" in proc.stderr
