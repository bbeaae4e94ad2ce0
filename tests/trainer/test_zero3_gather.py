"""ZeRO-3 parameter gathers on gloo read every parameter's real data (issue 18; the CI failure where rank 1's weight
digest was uninitialised memory, sum 2.98e25).

DeepSpeed 0.19.6's coalesced all-gather waits only for the last of its per-parameter async gathers, and gloo finishes
them in no set order, so a tensor can be read before its data arrived. ``build_deepspeed_config(gloo=True)`` (what the
trainer passes on CPU) makes ZeRO-3 gather one parameter at a time. One 2-process gloo run
(tests/trainer/zero3_gather_worker.py), 80 partitioned tensors gathered 40 times on each rank.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from deepgen_rl.services.ocr.launch import free_port
from deepgen_rl.trainer.deepspeed_utils import build_deepspeed_config
from tests.trainer.helpers import ROOT, subprocess_env

pytestmark = pytest.mark.slow


class _Args:
    max_grad_norm, learning_rate, weight_decay, bf16, fp16 = 0.0, 1e-3, 0.0, False, False
    adam_beta1, adam_beta2, adam_epsilon = 0.9, 0.999, 1e-8


@pytest.mark.parametrize("stage, gloo, expected", [(3, True, True), (3, False, None), (2, True, None)])
def test_gloo_zero3_config_gathers_sequentially(stage, gloo, expected):
    cfg = build_deepspeed_config({"zero_optimization": {"stage": stage}}, _Args(), 2, gloo=gloo)
    assert cfg["zero_optimization"].get("stage3_allgather_sequential") is expected


def test_a_value_set_in_the_json_is_kept():
    cfg = build_deepspeed_config({"zero_optimization": {"stage": 3, "stage3_allgather_sequential": False}},
                                 _Args(), 2, gloo=True)
    assert cfg["zero_optimization"]["stage3_allgather_sequential"] is False


def test_gathered_parameters_hold_their_real_values_on_every_rank(tmp_path):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           str(ROOT / "tests/trainer/zero3_gather_worker.py"), "ours"]
    # TMPDIR: torchrun's per-launch torchelastic_* folder stays in the test's folder, not in /tmp
    proc = subprocess.run(cmd, env=subprocess_env(TMPDIR=tmp_path), cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("GATHER_REPORT ")]
    assert proc.returncode == 0 and lines, f"worker failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n" \
                                           f"{proc.stderr[-6000:]}"
    r = json.loads(lines[-1].split(" ", 1)[1])["ours"]
    assert r["sequential"] is True and r["partitioned"] == 2 * 160  # every tensor really partitioned on both ranks
    assert r["bad_reads"] == 0, r
