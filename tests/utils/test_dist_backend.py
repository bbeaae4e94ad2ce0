"""``dist.comm_backend()`` names the backend that runs the collectives however the process group was initialised.

The trainer's real path on a CPU torchrun: transformers' ``TrainingArguments`` (through accelerate) initialises the
group without naming a backend, before ``init_process_group_if_needed`` runs, and ``torch.distributed.get_backend()``
then says "undefined". The trainer used to compare that with "gloo", so ZeRO-3 kept DeepSpeed's coalesced gather,
whose out-of-order gloo completions made a CI run's rank digest uninitialised memory (tests/trainer/test_zero3_gather.py
shows that gather's bad reads). Each case runs in its own interpreter (a process group is global state).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from deepgen_rl.services.ocr.launch import free_port
from tests.trainer.helpers import ROOT, subprocess_env

SCRIPTS = {
    # what accelerate's PartialState does on a CPU torchrun (LOCAL_RANK set, no CUDA): no backend named
    "no_backend": "torch.distributed.init_process_group(backend=None)",
    "gloo": "torch.distributed.init_process_group(backend='gloo')",
    # the real thing: GRPOConfig is a TrainingArguments, parsed before the trainer's own initialisation
    "training_arguments": "from deepgen_rl.config import GRPOConfig; GRPOConfig(output_dir=sys.argv[1], "
                          "report_to='none')",
}


def _run(case: str, tmp_path) -> dict:
    code = ("import json, sys, torch\n"
            f"{SCRIPTS[case]}\n"
            "from deepgen_rl.utils import dist\n"
            "print('BACKEND ' + json.dumps({'initialised': torch.distributed.is_initialized(), "
            "'get_backend': str(torch.distributed.get_backend()), 'comm_backend': dist.comm_backend()}))\n")
    env = subprocess_env(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                         MASTER_PORT=str(free_port()), CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("BACKEND ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    return json.loads(lines[-1].split(" ", 1)[1])


@pytest.mark.parametrize("case, reported", [("no_backend", "undefined"), ("gloo", "gloo"),
                                            ("training_arguments", "undefined")])
def test_comm_backend_is_gloo_on_cpu_whatever_get_backend_reports(case, reported, tmp_path):
    r = _run(case, tmp_path)
    assert r["initialised"] is True
    assert r["get_backend"] == reported  # the premise: "undefined" is what a plain get_backend() comparison saw
    assert r["comm_backend"] == "gloo"


def test_no_group_no_backend():
    from deepgen_rl.utils import dist

    if dist.is_dist():
        pytest.skip("this pytest process has a process group")
    assert dist.comm_backend() is None
