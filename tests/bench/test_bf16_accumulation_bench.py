"""bench/bf16_accumulation.py --smoke: one real ZeRO-2 update (1 gloo process, 3 policy pieces + the SFT term) in
fp32 and in DeepSpeed's bf16 mode; fp32 accumulates its pieces exactly, bf16 adds an error at bf16's resolution,
and the bench prints its table, ratios and rerun line."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def test_bf16_accumulation_smoke(tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", TMPDIR=str(tmp_path))
    proc = subprocess.run([sys.executable, str(ROOT / "bench/bf16_accumulation.py"), "--smoke"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert not list(tmp_path.glob("bf16_accum_*")), sorted(p.name for p in tmp_path.iterdir())  # its scratch: gone
    out = proc.stdout
    report = json.loads(next(ln for ln in out.splitlines() if ln.startswith("BF16_ACCUM_REPORT ")).split(" ", 1)[1])
    assert report["world"] == 1 and report["backwards"] == 4  # int(0.6 x 5) = 3 pieces + the SFT term
    assert report["module_dtype"] == {"fp32": "torch.float32", "bf16": "torch.bfloat16", "bf16_sft0": "torch.bfloat16"}
    assert report["nonfinite"] == {"fp32": 0.0, "bf16": 0.0, "bf16_sft0": 0.0}
    # fp32: the accumulated gradient is the sum of its pieces up to fp32 rounding; bf16 errs near its resolution
    assert report["fp32_accumulation"] < 1e-6
    assert 1e-4 < report["bf16_accumulation"] < 5e-2
    assert 1e-4 < report["bf16_end_to_end"] < 1e-1
    assert 0.5 < report["sft_kept"] < 1.5 and report["sft_piece_rel_norm"] > 0
    ratios = {m.group(1): float(m.group(2)) for m in re.finditer(r"^RATIO (.+): (\S+)x", out, re.M)}
    assert set(ratios) == {"bf16_accumulation_error (relative L2)", "bf16_end_to_end_error (relative L2)",
                           "sft_term_kept bf16 (fraction of lambda*g_sft)"}
    assert "relative L2 gradient error" in out
    assert "rerun: " in out and "bench/bf16_accumulation.py --smoke" in out
