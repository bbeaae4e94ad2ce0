"""bench/toy_sample_efficiency.py --smoke: exits 0, prints one row per arm in each table (strict accuracy, claim
score, own - other) with values and CPU-seconds, a PNG; bad --flags / --model_dir are clear errors."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_toy_sample_efficiency_smoke(tmp_path, toy_model_paths):
    png = tmp_path / "eff.png"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "DEEPGEN_TOY_DIR": toy_model_paths["root"]}
    # --model_dir loads the same model through model_dir_overrides, the path a built variant takes
    proc = subprocess.run([sys.executable, str(ROOT / "bench/toy_sample_efficiency.py"), "--smoke", "--png", str(png),
                           "--model_dir", toy_model_paths["root"], "--flags", '{"learning_rate": 2e-4}'],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [line for line in proc.stdout.splitlines() if line.startswith(("cps ", "flowgrpo "))]
    assert len(rows) == 6 and all(line.count(" @ ") == 2 for line in rows)  # 3 tables x 2 arms; evals at steps 0, 2
    assert png.stat().st_size > 1000 and "rerun: " in proc.stdout


@pytest.mark.parametrize("args, message", [
    (["--flags", "[1]"], "--flags must be a JSON object"),
    (["--flags", "{lr: 1}"], "--flags is not JSON"),
    (["--model_dir", "/nonexistent/toy"], "python -m deepgen_rl.toy.model --variant NAME --out"),
])
def test_toy_bench_refuses_bad_flags_and_model_dirs_before_training(tmp_path, args, message):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, str(ROOT / "bench/toy_sample_efficiency.py"), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr[-2000:]
