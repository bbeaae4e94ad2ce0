"""Rank 0 decides which checkpoint to resume and every rank follows (issue 18, item 3): with a ``.tmp`` checkpoint
whose rename was missed and a ``.old`` copy, 2 gloo ranks resume the same step."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from deepgen_rl.services.ocr.launch import free_port
from tests.trainer.helpers import ROOT, subprocess_env

pytestmark = pytest.mark.slow


def _checkpoint(folder: Path, step: int) -> None:
    folder.mkdir(parents=True)
    save_file({"w": torch.full((2,), float(step))}, str(folder / "dit.safetensors"))
    for name in ("sampler_state.json", "counters.json", "trainer_state.json"):
        (folder / name).write_text("{}")
    (folder / "checkpoint_meta.json").write_text(
        json.dumps({"format": "deepgen_rl.checkpoint.v1", "global_step": step}))


def test_two_ranks_resume_the_same_checkpoint(tmp_path):
    out = tmp_path / "out"
    _checkpoint(out / "checkpoint-1", 1)
    _checkpoint(out / "checkpoint-2.tmp", 2)   # complete, only the final rename was missed: promoted
    _checkpoint(out / "checkpoint-3.old", 3)   # the replaced copy of a step whose rewrite crashed: restored
    env = subprocess_env(WORLD_SIZE=2, MASTER_ADDR="127.0.0.1", MASTER_PORT=free_port())
    worker = str(Path(__file__).with_name("resume_rank_worker.py"))
    procs = [subprocess.Popen([sys.executable, worker, str(out), str(tmp_path / f"rank{r}.json")], cwd=ROOT,
                              env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for r in range(2)]
    logs = [p.communicate(timeout=240)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(x[-3000:] for x in logs)
    chosen = [json.loads((tmp_path / f"rank{r}.json").read_text())["path"] for r in range(2)]
    assert chosen == ["checkpoint-3", "checkpoint-3"], chosen
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint-1", "checkpoint-2", "checkpoint-3"]
