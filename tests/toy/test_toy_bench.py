"""bench/toy_sample_efficiency.py --smoke: exits 0, prints one row per arm in each table (strict accuracy, own, other,
own - other) with values, CPU-seconds and the sign test, a PNG; every arm of both settings is a valid trainer config
that differs from its setting's base arm only where the arm says; bad arguments are clear errors."""

from __future__ import annotations

import dataclasses
import json
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
    # 4 tables (strict, own, other, own - other) x 2 arms; evals at steps 0 and 2, then the sign test's "up/down, p"
    assert len(rows) == 8 and all(line.count(" @ ") == 2 and ", p " in line for line in rows), proc.stdout[-3000:]
    assert "setting prompt_following" in proc.stdout
    assert png.stat().st_size > 1000 and "rerun: " in proc.stdout


@pytest.mark.parametrize("args, message", [
    (["--flags", "[1]"], "--flags must be a JSON object"),
    (["--flags", "{lr: 1}"], "--flags is not JSON"),
    (["--model_dir", "/nonexistent/toy"], "python -m deepgen_rl.toy.model --variant NAME --out"),
    (["--steps", "0"], "--steps and --eval_every must be >= 1"),
    (["--arms", "cps,nope"], "--arms: unknown ['nope']"),
])
def test_toy_bench_refuses_bad_flags_and_model_dirs_before_training(tmp_path, args, message):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, str(ROOT / "bench/toy_sample_efficiency.py"), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr[-2000:]


def _bench_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("toy_sample_efficiency", ROOT / "bench/toy_sample_efficiency.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("setting", ["prompt_following", "fast"])
def test_every_arm_is_a_valid_config_that_changes_only_its_own_choice(tmp_path, setting):
    from deepgen_rl.toy.rl_run import PROMPT_FOLLOWING_FLAGS, toy_args

    bench = _bench_module()
    base = PROMPT_FOLLOWING_FLAGS if setting == "prompt_following" else {}
    args = {name: toy_args(tmp_path / name, **{**base, **flags}) for name, flags in bench.ARMS[setting].items()}
    fields = [f.name for f in dataclasses.fields(args["cps"]) if f.init and "dir" not in f.name]
    differs = {name: {k for k in fields if getattr(a, k) != getattr(args["cps"], k)} for name, a in args.items()}
    expected = {"cps": set(), "flowgrpo": {"atrain_sde_sampler"}, "dance": {"atrain_sde_sampler", "sde_eta"},
                "grpo": {"atrain_adv_type"}, "blind": {"reward_kwargs"}}
    expected.update({"full": {"sde_window_size", "reuse_last_velocity"}} if setting == "prompt_following"
                    else {"window": {"sde_window_size"}})
    assert differs == expected
    assert args["cps"].atrain_sde_sampler == "cps_sde" and args["cps"].atrain_adv_type == "gdpo"
    assert args["cps"].sde_window_size == (1 if setting == "prompt_following" else 0)
    assert json.loads(args["blind"].reward_kwargs)["toy_compositional"]["blind"] is True
    assert set(bench.ALIASES[setting].values()) <= set(bench.ARMS[setting])
