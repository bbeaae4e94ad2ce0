"""Start-up checks for GPU runs, exercised on the CPU: DeepSpeed CPU Adam buildability for zero3_offload (mocked
CUDA machine) and train.sh's multi-node OUTPUT_DIR rule."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

from deepgen_rl.trainer import deepspeed_utils as du
from tests.trainer.helpers import ROOT, subprocess_env

OFFLOAD = json.loads((ROOT / "scripts/deepspeed/zero3_offload.json").read_text())
ZERO2 = json.loads((ROOT / "scripts/deepspeed/zero2.json").read_text())


@pytest.fixture
def gpu_node(monkeypatch, tmp_path):
    """A CUDA 12.4 machine without a prebuilt cpu_adam; returns a function that sets the toolkit's state."""
    import deepspeed.git_version_info as gvi
    from torch.utils import cpp_extension

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    monkeypatch.setattr(gvi, "installed_ops", {"cpu_adam": False})
    monkeypatch.setattr(cpp_extension, "is_ninja_available", lambda: True)

    def toolkit(home: str | None, release: str | None = "12.4", nvcc: bool = True):
        monkeypatch.setattr(cpp_extension, "CUDA_HOME", home)
        if home and nvcc:
            (Path(home) / "bin").mkdir(parents=True, exist_ok=True)
            (Path(home) / "bin" / "nvcc").write_text("")
        monkeypatch.setattr(du, "_nvcc_release", lambda path: release)

    return toolkit


def test_cpu_adam_check_names_what_is_missing(gpu_node, tmp_path, monkeypatch):
    gpu_node(None)
    assert "CUDA_HOME is unset" in du.cpu_adam_problem(OFFLOAD)
    assert du.cpu_adam_problem(ZERO2) is None  # no optimizer offload: nothing to build
    gpu_node(str(tmp_path / "cuda"), nvcc=False)
    assert "bin/nvcc not found" in du.cpu_adam_problem(OFFLOAD)
    gpu_node(str(tmp_path / "cuda"), release="11.8")
    msg = du.cpu_adam_problem(OFFLOAD)
    assert "CUDA 11.8" in msg and "CUDA 12.4" in msg and "\n" not in msg
    gpu_node(str(tmp_path / "cuda"), release="12.1")
    assert du.cpu_adam_problem(OFFLOAD) is None  # same major version: buildable
    from torch.utils import cpp_extension

    monkeypatch.setattr(cpp_extension, "is_ninja_available", lambda: False)
    assert "ninja" in du.cpu_adam_problem(OFFLOAD)
    import deepspeed.git_version_info as gvi

    monkeypatch.setattr(gvi, "installed_ops", {"cpu_adam": True})
    assert du.cpu_adam_problem(OFFLOAD) is None  # prebuilt: nothing to compile


def test_cpu_adam_check_is_silent_on_cpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert du.cpu_adam_problem(OFFLOAD) is None


def test_multinode_train_sh_requires_output_dir(tmp_path):
    env = subprocess_env(NNODES="2", NODE_RANK="1")
    env.pop("OUTPUT_DIR", None)
    proc = subprocess.run(["bash", str(ROOT / "scripts/train.sh"), "--max_steps", "1"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "NNODES=2 needs OUTPUT_DIR" in proc.stderr
