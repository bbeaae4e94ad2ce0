"""bench/reward_throughput.py --smoke: every model reward measured in-process and served at concurrency 1 and 8 in
one run, served scores equal to in-process ones (no WARNING), finite ratios, the rerun line."""
import math
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_reward_throughput_smoke():
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "reward_throughput.py"), "--smoke"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert not re.search(r"^WARNING: ", out, re.M), out  # the bench's own warning: served != in-process
    for name in ("pickscore", "aesthetic", "hpsv2", "imagereward", "geneval"):
        assert re.search(rf"^{name}\s+in-process\s+-\s+\S+\s+1\.00$", out, re.M), out
        for concurrency in (1, 8):
            assert re.search(rf"^{name}\s+served \(batch 4\)\s+{concurrency}\s+\S+", out, re.M), out
            ratio = re.search(rf"^RATIO reward_throughput {name} served c={concurrency} / in-process: (\S+)x", out,
                              re.M)
            assert ratio and math.isfinite(float(ratio.group(1))) and float(ratio.group(1)) > 0
    assert "python bench/reward_throughput.py --smoke" in out
