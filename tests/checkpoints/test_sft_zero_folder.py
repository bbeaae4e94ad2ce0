"""The SFT training's raw DeepSpeed ZeRO folder (``iter_N.pth/``) loads directly, consolidated on CPU (issue 12,
item 4), and the SFT export writes the installed (transformers 4.56) key layout by default."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from deepgen_rl.services.ocr.launch import free_port
from tests.trainer.helpers import ROOT, TINY_CONFIG, subprocess_env

pytestmark = pytest.mark.slow


def test_sft_training_zero_folder_loads_into_the_model(tmp_path):
    env = subprocess_env(RANK=0, LOCAL_RANK=0, WORLD_SIZE=1, MASTER_ADDR="127.0.0.1", MASTER_PORT=free_port())
    worker = str(Path(__file__).with_name("sft_zero_folder_worker.py"))
    proc = subprocess.run([sys.executable, worker, str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    folder = tmp_path / "iter_2.pth"
    assert folder.is_dir() and not (folder / "dit.safetensors").exists()
    reference = load_file(str(tmp_path / "reference.safetensors"))
    assert any(".lora_" in k for k in reference) and any(k.startswith("transformer.") for k in reference)

    from deepgen_rl.models import build_model

    model = build_model(TINY_CONFIG, checkpoint=str(folder))
    report = model.load_reports[-1]
    assert not report.missing, report.missing[:5]
    own = model.state_dict()
    for key, value in reference.items():
        assert torch.equal(own[key].float(), value.float()), key  # fp32 masters of a fp32 run: exact
    # the checkpoint is not the starting point: ZeRO's Adam steps moved every saved tensor, in every part, so the
    # exact comparison above could only pass by reading the folder's values (not by keeping a fresh model's)
    fresh = build_model(TINY_CONFIG).state_dict()
    groups = {"lora": [k for k in reference if ".lora_" in k],
              "connector": [k for k in reference if k.startswith("connector.")],
              "projectors": [k for k in reference if k.startswith("projector_")],
              "meta_queries": [k for k in reference if k == "meta_queries"],
              "dit": [k for k in reference if k.startswith("transformer.")]}
    assert all(groups.values()), {g: len(v) for g, v in groups.items()}
    for group, keys in groups.items():
        unchanged = [k for k in keys if torch.equal(fresh[k], reference[k])]
        assert not unchanged, (group, unchanged[:3])
        moved = min(float((fresh[k].float() - reference[k].float()).abs().max()) for k in keys)
        assert moved > 1e-3, (group, moved)  # ~2 Adam steps of lr 1e-2: far above float noise
        assert all(torch.equal(own[k].float(), reference[k].float()) for k in keys), group


def test_export_writes_the_installed_layout_by_default():
    from deepgen_rl.checkpoints.sft import export_sft_state_dict
    from deepgen_rl.models import build_model

    model = build_model(TINY_CONFIG)
    sd = export_sft_state_dict(model)
    lora = [k for k in sd if ".lora_" in k]
    assert lora and all(k.startswith(("lmm.model.language_model.", "lmm.model.visual.", "lmm.lm_head."))
                        for k in lora), lora[:3]
    assert any(k.startswith("lmm.model.language_model.layers.") for k in lora)
    assert set(sd) <= set(model.state_dict())  # loadable with strict=False and no remap: nothing dropped
    legacy = export_sft_state_dict(model, legacy=True)
    assert any(k.startswith("lmm.model.layers.") for k in legacy)
