"""README's first command (the toy-world quickstart), shortened: bash scripts/quickstart.sh with QUICKSTART_STEPS=2.

Needs the pre-trained toy DeepGen (built once, ~6 CPU-minutes; DEEPGEN_TOY_TESTS=0 skips it: tests/toy/conftest.py).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_toy_quickstart_short(tmp_path, toy_model_paths):
    from deepgen_rl.toy.model import toy_dir

    out = tmp_path / "qs"
    env = {**os.environ, "QUICKSTART_STEPS": "2", "QUICKSTART_EVAL_EVERY": "2", "QUICKSTART_OUTPUT_DIR": str(out),
           "OMP_NUM_THREADS": "1", "DEEPGEN_TOY_DIR": toy_dir()}
    proc = subprocess.run(["bash", str(ROOT / "scripts/quickstart.sh")], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "toy DeepGen ready" in proc.stdout
    assert any(line.split()[:2] == ["toy_heldout", "strict_acc"] for line in proc.stdout.splitlines())
    for name in ("reward_curve.png", "accuracy_curve.png", "samples_before_after.png"):
        with Image.open(out / name) as im:
            im.verify()
    with Image.open(out / "samples_before_after.png") as im:
        assert im.size[0] == 12 * 160  # 12 held-out prompts, before and after
    report = (out / "report.html").read_text()
    for needle in ("samples_before_after.png", "accuracy_curve.png", "reward_curve.png", "claim_acc/position",
                   "eval/step_0/toy.html", "eval/step_2/toy.html", "Own prompt or any prompt?",
                   "trained with <code>exclusive=true</code>"):
        assert needle in report
    assert "held-out claim score against other prompts: " in proc.stdout
    assert (out / "checkpoint-2" / "checkpoint_meta.json").is_file()
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 2 and all(0.0 <= m["reward/toy_compositional"] <= 1.0 for m in metrics)
    for step in (0, 2):
        summary = json.loads((out / "eval" / f"step_{step}" / "toy_summary.json").read_text())
        assert summary["toy_heldout"]["num_images"] == 128 and summary["toy_train"]["num_images"] == 64
    verdicts = (out / "eval" / "step_2" / "toy_verdicts.jsonl").read_text().splitlines()
    assert len(verdicts) == 192 and all("verdict" in json.loads(v) for v in verdicts)


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("DEEPGEN_TOY_SLOW_TESTS") != "1",
                    reason="opt-in (~2 CPU-minutes, ~12 with the slots build): set DEEPGEN_TOY_SLOW_TESTS=1")
def test_toy_quickstart_slots_preset_runs_the_prompt_following_setting(tmp_path):
    """DEEPGEN_TOY_VARIANT=slots: the quickstart trains the slots model at 1,024 images per step with the SFT anchor
    on its own 4,096 train-split pairs (docs/toy_world.md, "Prompt following on the slots variant"), one step here."""
    from deepgen_rl.toy.model import ensure_toy_deepgen

    root = ensure_toy_deepgen(progress=False, variant="slots")["root"]
    out = tmp_path / "qs"
    env = {**os.environ, "DEEPGEN_TOY_VARIANT": "slots", "DEEPGEN_TOY_DIR": root, "QUICKSTART_STEPS": "1",
           "QUICKSTART_EVAL_EVERY": "1", "QUICKSTART_OUTPUT_DIR": str(out), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(["bash", str(ROOT / "scripts/quickstart.sh")], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "training the toy DeepGen (slots) for 1 MR-GRPO steps" in proc.stdout
    log = (out / "logs" / "train.log").read_text()
    assert "per step 128 prompts x 8 = 1024 images" in log
    assert len((out / "sftaux" / "train.jsonl").read_text().splitlines()) == 4096
    (m,) = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert m["reward_calls/toy_compositional"] == 1024 and m["train/sft_loss"] > 0
    assert 0.9 <= m["train/update_image_fraction"] < 1.0  # --skip_zero_advantage left some images out
    args = json.loads((out / "checkpoint-1" / "training_args.json").read_text())
    assert (args["rollout_global_batch_size"], args["sftaux_coef"], args["skip_zero_advantage"]) == (1024, 0.003, True)
    run_args = json.loads((out / "run_args.json").read_text())
    assert run_args["data"]["sftaux_dataset_config"] == str(out / "sftaux" / "toy_sftaux.py")
    assert (out / "report.html").is_file() and (out / "eval" / "step_1" / "toy_summary.json").is_file()
