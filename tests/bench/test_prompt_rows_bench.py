"""bench/prompt_rows.py --smoke: prints the length/truncation table, the FLOP ratios and the mask's step-time ratio."""

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.shared_data import SHARED_DATA

ROOT = Path(__file__).resolve().parents[2]
HAVE_DATA = SHARED_DATA.is_dir() or (ROOT / "assets/rl_datasets/deepgen/corebench.txt").is_file()


@pytest.mark.skipif(not HAVE_DATA, reason="needs the recipe's prompt files: ../shared/data (CI) or "
                    "bash scripts/download_data.sh")
def test_prompt_rows_smoke():
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    proc = subprocess.run([sys.executable, str(ROOT / "bench/prompt_rows.py"), "--smoke"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    ratios = {m.group(1): float(m.group(2)) for m in re.finditer(r"^RATIO (.+): (\S+)x", out, re.M)}
    flops_alone = next(v for k, v in ratios.items() if k.startswith("dit_flops after/before (prompt alone"))
    flops_batch = next(v for k, v in ratios.items() if k.startswith("dit_flops after/before (micro-batch"))
    mask = next(v for k, v in ratios.items() if k.startswith("step_time masked/unmasked"))
    # recipe prompts are mostly far shorter than 256 tokens: fewer rows, fewer FLOPs; a micro-batch pads to its
    # longest prompt, so it sits between the single prompt and the old fixed 384 rows
    assert 0.5 < flops_alone < flops_batch < 1.0
    assert math.isfinite(mask) and mask > 0
    assert "corebench.txt" in out and "> 1024 (new)" in out and "rerun: " in out
    corebench = next(line for line in out.splitlines() if line.startswith("corebench.txt"))
    (old_central, _), new = re.findall(r"(\S+)% / (\S+)%", corebench)
    assert float(old_central) > 0 and new == ("0.0", "0.0")  # truncated at 256 tokens, nothing at 1024
