"""The text mask survives real DeepSpeed engines and the EMA DiT (issue 12, item 1b): for prompts of different
lengths, with CFG, every velocity computed through a ZeRO-2 engine, a ZeRO-3 engine that partitions every DiT tensor
over 2 gloo ranks, the frozen KL reference and the EMA DiT that evaluation uses equals, to 1e-5 in fp32, diffusers'
stock DiT (same weights) fed only that prompt's n + Q rows, encoded alone. One torchrun run of
tests/models/dit_mask_deepspeed_worker.py (2 CPU processes; which paths and weights it checks: its docstring)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from deepgen_rl.services.ocr.launch import free_port
from tests.models.text_mask_checks import ATOL
from tests.trainer.helpers import ROOT, subprocess_env

pytestmark = pytest.mark.slow
CASES = ["zero2", "zero3"]
PATHS = ["rollout", "training", "eval_live", "eval_ema"]


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           str(ROOT / "tests/models/dit_mask_deepspeed_worker.py"), ",".join(CASES)]
    scratch = tmp_path_factory.mktemp("tmpdir")  # the worker's TMPDIR: its scratch folders must be gone after
    proc = subprocess.run(cmd, env=subprocess_env(TMPDIR=scratch), cwd=ROOT, capture_output=True, text=True,
                          timeout=900)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("MASK_REPORT ")]
    assert proc.returncode == 0 and lines, f"worker failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n" \
                                           f"{proc.stderr[-6000:]}"
    assert not list(scratch.glob("dit_mask_ds_*")), sorted(p.name for p in scratch.iterdir())
    per_rank = json.loads(lines[-1].split(" ", 1)[1])
    assert len(per_rank) == 2
    return per_rank


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("case", CASES)
def test_velocity_through_the_engine_equals_each_prompt_alone(reports, case, path):
    for rank, report in enumerate(reports):
        r = report[case][path]
        assert r["max_abs_diff"] <= ATOL, (rank, r)
        assert r["masked_calls"] >= 1 and r["rows"] >= 3, (rank, r)  # some call mixed prompt lengths


@pytest.mark.parametrize("case", CASES)
def test_each_path_ran_through_what_the_trainer_uses(reports, case):
    r = reports[0][case]
    # rollout: 2 micro-batches x 2 steps; training: policy and KL-reference forwards; eval: this rank's 3 images
    # in one batch x 2 steps (live DiT and EMA DiT alike)
    assert (r["rollout"]["calls"], r["eval_live"]["calls"], r["eval_ema"]["calls"]) == (4, 2, 2)
    assert r["training_transformers"] == ["engine", "ref"]
    parted, total = r["partitioned"]
    if case == "zero3":  # really partitioned: no rank holds any DiT tensor whole outside a forward
        assert parted == total > 0
    else:
        assert parted == 0


@pytest.mark.parametrize("case", CASES)
def test_the_ema_dit_is_neither_the_initial_nor_the_live_weights(reports, case):
    r = reports[0][case]
    assert r["live_vs_initial"] > 1e-5  # the engine's optimizer step moved the weights
    assert r["ema_vs_initial"] > 1e-5 and r["ema_vs_live"] > 1e-5  # EMA = (θ0 + θ1) / 2: its own weights
