"""Non-finite losses are skipped and counted, never applied; under DeepSpeed the accumulation boundary is still
closed when the skipped piece is the last one (its gradients are reduced and exactly one step is taken)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.trainer.helpers import ROOT, free_port, subprocess_env


def _drive(tmp_path, mode, which):
    env = subprocess_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=free_port(), RANK=0, LOCAL_RANK=0, WORLD_SIZE=1)
    proc = subprocess.run([sys.executable, str(ROOT / "tests/trainer/nonfinite_driver.py"), str(tmp_path / mode),
                           mode, which], env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_last_piece_nonfinite_plain_and_zero2_agree(tmp_path):
    runs = {mode: _drive(tmp_path, mode, "last") for mode in ("plain", "zero2")}
    for r in runs.values():
        assert r["nonfinite"] == [1.0, 1.0]
        assert r["steps"] == [1.0, 2.0] and r["skipped"] == [0.0, 0.0]
        assert r["weights_finite"] and not r["weights_unchanged"]
    # the 3 finite pieces' gradients reached the optimizer under ZeRO-2 exactly as in plain PyTorch
    plain, zero2 = runs["plain"]["weights"], runs["zero2"]["weights"]
    for name, values in plain.items():
        assert values == pytest.approx(zero2[name], rel=1e-4, abs=1e-6), name
    assert plain != {}


@pytest.mark.slow
def test_all_pieces_nonfinite_skips_the_update(tmp_path):
    r = _drive(tmp_path, "plain", "all")
    assert r["nonfinite"] == [4.0, 4.0]
    assert r["steps"] == [0.0, 0.0] and r["skipped"] == [1.0, 2.0]
    assert r["weights_finite"] and r["weights_unchanged"] and r["optimizer_state_empty"]


@pytest.mark.slow
def test_finite_loss_with_infinite_gradient_is_not_applied(tmp_path):
    r = _drive(tmp_path, "plain", "infgrad")
    assert r["nonfinite"] == [0.0, 0.0]  # the losses themselves were finite
    assert r["steps"] == [0.0, 0.0] and r["skipped"] == [1.0, 2.0]
    assert r["weights_finite"] and r["weights_unchanged"] and r["optimizer_state_empty"]
