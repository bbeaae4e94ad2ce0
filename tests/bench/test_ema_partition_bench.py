"""bench/ema_partition.py --smoke: 2 gloo processes; the partitioned EMA holds half the bytes of the full copy on each
rank, equals it after the rounds, and the bench prints its ratios and rerun line."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def test_ema_partition_smoke():
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    proc = subprocess.run([sys.executable, str(ROOT / "bench/ema_partition.py"), "--smoke"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    ratios = {m.group(1): float(m.group(2)) for m in re.finditer(r"^RATIO (.+): (\S+)x", out, re.M)}
    for cfg in ("zero2", "zero3_all"):
        assert ratios[f"ema_bytes partitioned/full ({cfg}, 2 ranks)"] == pytest.approx(0.5, abs=0.02)
        assert 0 < ratios[f"ema_update_time partitioned/full ({cfg})"] < float("inf")
        row = next(ln for ln in out.splitlines() if ln.startswith(cfg + " "))
        assert float(row.split()[-1]) < 1e-6  # the gathered partitioned EMA equals the full copy
    assert "rerun: " in out and "bench/ema_partition.py --smoke" in out
