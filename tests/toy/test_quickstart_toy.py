"""README's first command (the toy-world quickstart), shortened: bash scripts/quickstart.sh with QUICKSTART_STEPS=1 on
its default two ranks. It runs scripts/toy_prompt_following.sh's setting on the `slots_wide` toy DeepGen (built once,
~8-13 CPU-minutes; DEEPGEN_TOY_TESTS=0 skips it: tests/toy/conftest.py), then writes the report.
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
    out = tmp_path / "qs"
    env = {**os.environ, "QUICKSTART_STEPS": "1", "QUICKSTART_EVAL_EVERY": "1", "QUICKSTART_OUTPUT_DIR": str(out),
           "DEEPGEN_TOY_DIR": toy_model_paths["root"]}
    env.pop("DEEPGEN_TOY_VARIANT", None)
    proc = subprocess.run(["bash", str(ROOT / "scripts/quickstart.sh")], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert "[quickstart] MR-GRPO on the toy DeepGen (slots_wide) for 1 steps on the CPU: " + str(out) in lines
    assert "[toy] training up to 1 steps on 2 ranks, seed 0: " + str(out) + f" (log: {out}/train.log)" in lines
    # the live lines: one per step and one per eval (step 0 and step 1)
    assert sum(line.startswith("[toy]   update 1: reward 0.") for line in lines) == 1, proc.stdout[-3000:]
    assert sum(line.startswith("[toy]   held-out eval: strict accuracy 0.") for line in lines) == 2
    assert any(line.startswith("step\tmin\tstrict") for line in lines)  # run_report's per-prompt table
    for name in ("reward_curve.png", "accuracy_curve.png", "samples_before_after.png"):
        with Image.open(out / name) as im:
            im.verify()
    with Image.open(out / "samples_before_after.png") as im:
        assert im.size[0] == 12 * 160  # 12 held-out prompts, before and after
    report = (out / "report.html").read_text()
    for needle in ("samples_before_after.png", "accuracy_curve.png", "reward_curve.png", "claim_acc/position",
                   "eval/step_0/toy.html", "eval/step_1/toy.html", "Own prompt or any prompt?",
                   "trained with <code>exclusive=true</code>"):
        assert needle in report
    assert "held-out claim score against other prompts: " in proc.stdout
    changed = "<h3>Images whose verdict changed</h3>" in report  # the second grid, when a verdict changed
    assert changed == (out / "samples_changed.png").is_file()
    assert changed or "No held-out eval image changed its verdict." in report
    assert (out / "checkpoint-1" / "checkpoint_meta.json").is_file()
    (m,) = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert m["reward_calls/toy_compositional"] == 1024 and 0.0 <= m["reward/toy_compositional"] <= 1.0
    assert m["train/sft_loss"] > 0
    args = json.loads((out / "checkpoint-1" / "training_args.json").read_text())
    assert (args["rollout_global_batch_size"], args["sftaux_coef"], args["sde_window_range"]) == (1024, 0.001, "3,6")
    assert len((out / "sftaux" / "train.jsonl").read_text().splitlines()) == 4096
    for step in (0, 1):
        summary = json.loads((out / "eval" / f"step_{step}" / "toy_summary.json").read_text())
        assert set(summary) == {"toy_heldout"} and summary["toy_heldout"]["num_images"] == 512
    verdicts = (out / "eval" / "step_1" / "toy_verdicts.jsonl").read_text().splitlines()
    assert len(verdicts) == 512 and all("verdict" in json.loads(v) for v in verdicts)


@pytest.mark.parametrize("name, value, kind", [("QUICKSTART_STEPS", "ten", "a positive"),
                                               ("QUICKSTART_EVAL_EVERY", "0", "a positive"),
                                               ("QUICKSTART_SEED", "-1", "a non-negative")])
def test_a_bad_quickstart_setting_is_one_line_naming_it(tmp_path, name, value, kind):
    out = tmp_path / "qs"
    env = {**os.environ, "QUICKSTART_OUTPUT_DIR": str(out), name: value}
    proc = subprocess.run(["bash", str(ROOT / "scripts/quickstart.sh")], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"scripts/quickstart.sh: {name} must be {kind} integer, got '{value}'"
    assert not out.exists()
