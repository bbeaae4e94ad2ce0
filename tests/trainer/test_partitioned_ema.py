"""The EMA keeps each rank's partition of the fp32 masters (issue 18 item 5): after 3 optimizer steps under ZeRO-2 and a
ZeRO-3 that partitions every parameter (fp32 and bf16 modes), the gathered EMA equals the closed-form EMA of the full
fp32 masters observed after each step, and the no-DeepSpeed run's EMA; each rank stores about 1/world of it; a
save → load round trip restores it exactly. One 2-process gloo run (tests/trainer/ema_worker.py), ~20 s."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from deepgen_rl.services.ocr.launch import free_port
from tests.trainer.helpers import ROOT, subprocess_env

pytestmark = pytest.mark.slow
CASES = ["none", "zero2", "zero2_bf16", "zero3", "zero3_all", "zero3_all_bf16"]
PARTITIONED = CASES[1:]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           str(ROOT / "tests/trainer/ema_worker.py"), ",".join(CASES)]
    scratch = tmp_path_factory.mktemp("tmpdir")  # the worker's TMPDIR: its scratch folders must be gone after
    proc = subprocess.run(cmd, env=subprocess_env(TMPDIR=scratch), cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("EMA_REPORT ")]
    assert proc.returncode == 0 and lines, f"worker failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n" \
                                           f"{proc.stderr[-6000:]}"
    assert not list(scratch.glob("ema_worker_*")), sorted(p.name for p in scratch.iterdir())
    return json.loads(lines[-1].split(" ", 1)[1])


@pytest.mark.parametrize("case", CASES)
def test_gathered_ema_is_the_closed_form_of_the_fp32_masters(report, case):
    r = report[case]
    assert r["init_diff"] == 0.0  # the fragments assembled = DeepSpeed's own full fp32 masters: the mapping is right
    assert r["ema_vs_closed_form"] < 1e-6, r
    assert r["ema_vs_masters"] > 1e-3  # the EMA lags the weights: the comparison above is not trivially passed
    assert r["shapes_ok"] is True


@pytest.mark.parametrize("case", ["zero2", "zero3", "zero3_all"])
def test_partitioned_ema_equals_the_no_deepspeed_run(report, case):
    ref, mine = report["none"]["ema"], report[case]["ema"]
    assert mine.keys() == ref.keys()
    diff = max(float((torch.tensor(mine[k]) - torch.tensor(ref[k])).abs().max()) for k in ref)
    assert diff < 1e-6


@pytest.mark.parametrize("case", ["zero2_bf16", "zero3_all_bf16"])
def test_bf16_mode_ema_follows_the_masters_not_the_module(report, case):
    r = report[case]
    assert r["masters_vs_bf16_module"] > 1e-4  # the bf16 module weights differ from the masters the EMA tracks
    assert r["ema_vs_closed_form"] < 1e-6


@pytest.mark.parametrize("case", PARTITIONED)
def test_each_rank_stores_its_share(report, case):
    r = report[case]
    full, local = r["numel_full"], r["numel_local"]
    assert full == 7 * 13 + 13 + 13 * 5 + 5 + 2 * 5 + 5 + 1 == 190
    assert sum(local) == full  # the fragments tile the parameters: nothing stored twice
    assert all(abs(n - full / 2) <= 6 for n in local), local  # ≈ full/world (ZeRO-3: per-tensor ceil rounding)
    if case.startswith("zero2"):
        assert r["split_params"] >= 1  # a parameter split between the ranks' flat partitions was handled
    elif case == "zero3":
        assert r["partitioned"] == [0, 8]  # the module keeps every tensor whole; the masters are still partitioned
    else:  # really partitioned: every tensor but the 1-element bias (ZeRO-3 cannot split it; rank 1 holds padding)
        assert r["partitioned"] == [7, 8]
    assert report["none"]["numel_local"] == [190, 190]  # without DeepSpeed: the one full copy


@pytest.mark.parametrize("case", CASES)
def test_rank0_only_gather_and_resume_round_trip(report, case):
    r = report[case]
    assert r["rank0_only_lengths"] == [8, 0] and r["rank0_only_equal"] is True
    assert r["fresh_differs"] is True  # the EMA loaded into differs from the saved one before loading
    assert r["resume_max_diff"] == 0.0
    assert r["resume_next_update_diff"] == 0.0
