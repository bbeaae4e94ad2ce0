"""Checkpoint loading: 4.51 -> installed key map, round trips, strictness, path errors, tiny cache."""

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import save_file

from tests.models.paths import REAL_CONFIG, REPO, TINY_CONFIG
from deepgen_rl.models import ModelPathError, build_model
from deepgen_rl.checkpoints.sft import (CheckpointKeyError, export_sft_state_dict, load_checkpoint,
                                                  to_installed_key, to_legacy_layout)
from deepgen_rl.models.tiny import PRESETS, make_tiny_deepgen

PROMPTS = ["a red cat", "a very long prompt about two dogs running across a green field under a clear sky", ""]


def _outputs(model):
    torch.manual_seed(0)
    latents = torch.randn(3, *model.latent_shape(64, 64))
    cond = model.encode_prompts(PROMPTS)
    with torch.no_grad():
        v = model.predict_velocity(latents, torch.tensor([0.9, 0.5, 0.2]), cond)
    return cond, v


def test_key_map_examples():
    cases = {
        "lmm.model.layers.3.self_attn.q_proj.lora_A.default.weight":
            "lmm.model.language_model.layers.3.self_attn.q_proj.lora_A.default.weight",
        "lmm.model.embed_tokens.lora_embedding_B.default": "lmm.model.language_model.embed_tokens.lora_embedding_B.default",
        "lmm.model.norm.weight": "lmm.model.language_model.norm.weight",
        "lmm.visual.blocks.0.attn.qkv.lora_B.default.weight": "lmm.model.visual.blocks.0.attn.qkv.lora_B.default.weight",
        "lmm.visual.merger.mlp.0.weight": "lmm.model.visual.merger.mlp.0.weight",
        "lmm.lm_head.lora_A.default.weight": "lmm.lm_head.lora_A.default.weight",
        # peft wrapper prefix and adapter-less LoRA names
        "lmm.base_model.model.model.layers.0.mlp.up_proj.lora_A.weight":
            "lmm.model.language_model.layers.0.mlp.up_proj.lora_A.default.weight",
        "lmm.model.embed_tokens.lora_embedding_A": "lmm.model.language_model.embed_tokens.lora_embedding_A.default",
        # already-installed layout and non-VLM keys are unchanged
        "lmm.model.language_model.layers.1.mlp.up_proj.lora_A.default.weight":
            "lmm.model.language_model.layers.1.mlp.up_proj.lora_A.default.weight",
        "connector.layers.0.self_attn.q_proj.weight": "connector.layers.0.self_attn.q_proj.weight",
        "transformer.pos_embed.proj.weight": "transformer.pos_embed.proj.weight",
    }
    for old, new in cases.items():
        assert to_installed_key(old) == new, old


def test_round_trip_save_pretrained_and_state_dict_bitwise(tiny_model, tmp_path):
    src = tiny_model
    # Make the DiT differ from the cached files so that the saved copy is what gets loaded.
    model = build_model(TINY_CONFIG)
    with torch.no_grad():
        for p in model.transformer.parameters():
            p.add_(0.01 * torch.randn_like(p))
    cond_a, v_a = _outputs(model)

    sd3 = tmp_path / "sd3"
    model.transformer.save_pretrained(sd3 / "transformer")
    model.vae.save_pretrained(sd3 / "vae")
    model.scheduler.save_pretrained(sd3 / "scheduler")
    sft = export_sft_state_dict(model, legacy=True)
    assert not any("language_model" in k for k in sft)
    torch.save({"state_dict": sft}, tmp_path / "sft.pth")
    nodit = {k: v for k, v in sft.items() if not k.startswith("transformer.")}
    torch.save({"module": nodit}, tmp_path / "sft_nodit.pth")
    ckpt_dir = tmp_path / "checkpoint-3"
    ckpt_dir.mkdir()
    save_file({k[len("transformer."):]: v.contiguous() for k, v in sft.items() if k.startswith("transformer.")},
              str(ckpt_dir / "dit.safetensors"))

    variants = {
        "pth": build_model(TINY_CONFIG, checkpoint=str(tmp_path / "sft.pth"), default_checkpoint=None),
        "save_pretrained": build_model(TINY_CONFIG, checkpoint=str(tmp_path / "sft_nodit.pth"), sd3_path=str(sd3),
                                       default_checkpoint=None),
        "dit_dir": build_model(TINY_CONFIG, checkpoint=str(ckpt_dir)),  # default SFT ckpt, then the DiT
    }
    for name, loaded in variants.items():
        cond_b, v_b = _outputs(loaded)
        assert torch.equal(cond_a.prompt_embeds, cond_b.prompt_embeds), name
        assert torch.equal(cond_a.pooled_embeds, cond_b.pooled_embeds), name
        assert torch.equal(v_a, v_b), name
    assert variants["pth"].load_reports[-1].missing == []
    assert variants["dit_dir"].load_reports[-1].missing == []
    # sanity: the perturbed DiT really differs from the cached one
    assert not torch.equal(_outputs(src)[1], v_a)


def test_legacy_full_state_dict_lands_on_every_key(tmp_path):
    model = build_model(TINY_CONFIG, default_checkpoint=None)
    own = model.state_dict()
    # A deterministic transform keeps tied tensors (lm_head / embed_tokens) consistent.
    legacy = to_legacy_layout({k: v.clone() * 0.5 + 0.25 for k, v in own.items()})
    assert any(k.startswith("lmm.model.layers.") for k in legacy)
    assert any(k.startswith("lmm.visual.") for k in legacy)
    assert any(k.startswith("lmm.model.embed_tokens.") for k in legacy)
    assert any(".lora_A.default." in k for k in legacy)
    assert not any("language_model" in k or k.startswith("lmm.model.visual.") for k in legacy)
    path = tmp_path / "legacy.pth"
    torch.save(legacy, path)

    report = load_checkpoint(model, str(path))
    assert report.missing == [] and len(report.loaded) == len(own)
    after = model.state_dict()
    for key, value in legacy.items():
        assert torch.equal(after[to_installed_key(key)], value), key


def test_base_weights_without_base_layer_and_ignorable_keys(tmp_path):
    model = build_model(TINY_CONFIG, default_checkpoint=None)
    q = "lmm.model.layers.0.self_attn.q_proj"
    value = torch.full_like(model.state_dict()["lmm.model.language_model.layers.0.self_attn.q_proj.base_layer.weight"],
                            0.125)
    torch.save({f"{q}.weight": value, "ema.transformer.x": torch.zeros(1), "vit_mean": torch.zeros(3)},
               tmp_path / "ckpt.pth")
    report = load_checkpoint(model, str(tmp_path / "ckpt.pth"))
    assert report.loaded == ["lmm.model.language_model.layers.0.self_attn.q_proj.base_layer.weight"]
    assert sorted(report.ignored) == ["ema.transformer.x", "vit_mean"]
    assert torch.equal(model.lmm.model.language_model.layers[0].self_attn.q_proj.base_layer.weight, value)
    assert "projector_1.weight" in report.missing  # logged, not silently lost


def test_unknown_keys_and_shape_mismatch_raise(tmp_path):
    model = build_model(TINY_CONFIG, default_checkpoint=None)
    torch.save({"connector.layers.0.self_attn.q_proj.weight": torch.zeros(64, 64), "lmm.foo.bar": torch.zeros(1)},
               tmp_path / "unknown.pth")
    with pytest.raises(CheckpointKeyError, match="lmm.foo.bar"):
        load_checkpoint(model, str(tmp_path / "unknown.pth"))
    torch.save({"projector_1.weight": torch.zeros(3, 3)}, tmp_path / "shape.pth")
    with pytest.raises(CheckpointKeyError, match="shape"):
        load_checkpoint(model, str(tmp_path / "shape.pth"))


def test_lora_checkpoint_into_model_without_lora_raises(tiny_model_paths):
    with pytest.raises(CheckpointKeyError, match="lora_rank"):
        build_model(TINY_CONFIG, lora_rank=0)


def test_real_config_builds_from_env_paths(tiny_model, tiny_model_paths, monkeypatch):
    monkeypatch.setenv("QWEN2_5_VL_MODEL_NAME_OR_PATH", tiny_model_paths["qwen"])
    monkeypatch.setenv("SD3_5_MODEL_NAME_OR_PATH", tiny_model_paths["sd3"])
    tiny = PRESETS["tiny"]["deepgen"]
    model = build_model(REAL_CONFIG, checkpoint=tiny_model_paths["checkpoint"], dtype="float32", **tiny)
    cond_a, v_a = _outputs(model)
    cond_b, v_b = _outputs(tiny_model)
    assert torch.equal(cond_a.prompt_embeds, cond_b.prompt_embeds) and torch.equal(v_a, v_b)


def test_model_path_errors_name_the_env_var(tmp_path, tiny_model_paths, monkeypatch):
    monkeypatch.delenv("QWEN2_5_VL_MODEL_NAME_OR_PATH", raising=False)
    monkeypatch.delenv("SD3_5_MODEL_NAME_OR_PATH", raising=False)
    with pytest.raises(ModelPathError, match=r"QWEN2_5_VL_MODEL_NAME_OR_PATH is not set: expected a folder"):
        build_model(REAL_CONFIG)
    monkeypatch.setenv("QWEN2_5_VL_MODEL_NAME_OR_PATH", tiny_model_paths["qwen"])
    with pytest.raises(ModelPathError, match=r"SD3_5_MODEL_NAME_OR_PATH is not set"):
        build_model(REAL_CONFIG)
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("SD3_5_MODEL_NAME_OR_PATH", str(empty))
    with pytest.raises(ModelPathError) as err:
        build_model(REAL_CONFIG)
    assert str(err.value) == (f"SD3_5_MODEL_NAME_OR_PATH={empty} is empty: expected a folder with transformer/, "
                              "vae/, scheduler/ (diffusers layout of UniPic2-SD3.5M-Kontext-2B)")
    partial = tmp_path / "partial"
    shutil.copytree(os.path.join(tiny_model_paths["sd3"], "transformer"), partial / "transformer")
    monkeypatch.setenv("SD3_5_MODEL_NAME_OR_PATH", str(partial))
    with pytest.raises(ModelPathError, match=r"lacks vae/, scheduler/"):
        build_model(REAL_CONFIG)
    monkeypatch.setenv("QWEN2_5_VL_MODEL_NAME_OR_PATH", str(tmp_path / "nope"))
    with pytest.raises(ModelPathError, match=r"QWEN2_5_VL_MODEL_NAME_OR_PATH=.*nope does not exist"):
        build_model(REAL_CONFIG)
    with pytest.raises(KeyError, match="not_a_key"):
        build_model(TINY_CONFIG, not_a_key=1)


def test_tiny_config_mirrors_preset():
    from mmengine.config import Config

    cfg = Config.fromfile(TINY_CONFIG, lazy_import=False).to_dict()
    for key, value in PRESETS["tiny"]["deepgen"].items():
        assert cfg[key] == value, key
    real = Config.fromfile(REAL_CONFIG, lazy_import=False).to_dict()
    assert real["connector"] == dict(hidden_size=2048, num_hidden_layers=6, num_attention_heads=32,
                                     intermediate_size=11946)
    assert (real["num_queries"], real["lora_rank"], real["lora_alpha"], real["dtype"]) == (128, 64, 128, "bfloat16")


def test_small_preset_dit_size():
    from diffusers import SD3Transformer2DModel

    with torch.device("meta"):
        dit = SD3Transformer2DModel(patch_size=2, in_channels=16, out_channels=16, pos_embed_max_size=32,
                                    qk_norm="rms_norm", **PRESETS["small"]["dit"])
    assert 10e6 < sum(p.numel() for p in dit.parameters()) < 30e6


def test_make_tiny_is_deterministic(tiny_model_paths, tmp_path):
    paths = make_tiny_deepgen(str(tmp_path / "again"))
    a = torch.load(paths["checkpoint"], weights_only=True)
    b = torch.load(tiny_model_paths["checkpoint"], weights_only=True)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    for rel in ("qwen/model.safetensors", "qwen/tokenizer.json", "sd3/transformer/diffusion_pytorch_model.safetensors",
                "sd3/vae/diffusion_pytorch_model.safetensors"):
        with open(os.path.join(paths["root"], rel), "rb") as f1, open(os.path.join(tiny_model_paths["root"], rel),
                                                                      "rb") as f2:
            assert f1.read() == f2.read(), rel


def test_outdated_tiny_cache_is_rebuilt(tmp_path, monkeypatch):
    import deepgen_rl.models.tiny as tiny

    def fake_build(out_dir, preset="tiny", seed=0):
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, tiny.DONE_MARKER), "w") as f:
            json.dump({"preset": preset, "version": tiny.CACHE_VERSION}, f)
        return tiny.tiny_paths(out_dir)

    root = tmp_path / "tiny"
    root.mkdir()
    (root / tiny.DONE_MARKER).write_text(json.dumps({"preset": "tiny", "version": "v0"}))
    (root / "old_file").write_text("x")
    monkeypatch.setenv("DEEPGEN_TINY_DIR", str(root))
    monkeypatch.setattr(tiny, "make_tiny_deepgen", fake_build)
    assert tiny.ensure_tiny_deepgen()["root"] == str(root)
    assert sorted(os.listdir(root)) == [tiny.DONE_MARKER] and os.listdir(tmp_path) == ["tiny"]
    unrelated = tmp_path / "unrelated"
    unrelated.mkdir()
    (unrelated / "data").write_text("keep me")
    monkeypatch.setenv("DEEPGEN_TINY_DIR", str(unrelated))
    with pytest.raises(OSError):
        tiny.ensure_tiny_deepgen()
    assert (unrelated / "data").read_text() == "keep me"


_RACE_SCRIPT = """
import json, os, sys, time
import deepgen_rl.models.tiny as tiny

sync = sys.argv[1]

def slow_fake_build(out_dir, preset="tiny", seed=0):  # stands in for the real build; slow enough to overlap
    os.makedirs(out_dir, exist_ok=True)
    open(os.path.join(sync, f"built-{os.getpid()}"), "w").close()
    time.sleep(1.0)
    with open(os.path.join(out_dir, tiny.DONE_MARKER), "w") as f:
        json.dump({"builder": os.getpid(), "preset": preset, "version": tiny.CACHE_VERSION}, f)
    return tiny.tiny_paths(out_dir)

tiny.make_tiny_deepgen = slow_fake_build
open(os.path.join(sync, f"ready-{os.getpid()}"), "w").close()
deadline = time.time() + 60
while sum(n.startswith("ready-") for n in os.listdir(sync)) < 2 and time.time() < deadline:  # barrier
    time.sleep(0.01)
print(json.dumps(dict(tiny.ensure_tiny_deepgen(), pid=os.getpid())))
"""


def test_tiny_cache_creation_survives_a_race(tmp_path):
    sync, cache = tmp_path / "sync", tmp_path / "cache"
    sync.mkdir()
    cache.mkdir()
    env = dict(os.environ, DEEPGEN_TINY_DIR=str(cache / "tiny"))
    procs = [subprocess.Popen([sys.executable, "-c", _RACE_SCRIPT, str(sync)], cwd=REPO, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    results = [json.loads(o[0].strip().splitlines()[-1]) for o in outs]
    assert results[0]["root"] == results[1]["root"] == str(cache / "tiny")
    assert len([n for n in os.listdir(sync) if n.startswith("built-")]) == 2  # both really built: a race
    with open(cache / "tiny" / "tiny_paths.json") as f:
        assert json.load(f)["builder"] in {r["pid"] for r in results}
    assert os.listdir(cache) == ["tiny"]  # the loser's temp folder is gone


def test_no_import_circle_between_build_and_tiny():
    """``build`` imports ``tiny`` (presets); ``tiny`` builds its SFT checkpoint through ``assemble``, never ``build``."""
    import ast
    from pathlib import Path

    models = Path(__file__).resolve().parents[2] / "deepgen_rl" / "models"

    def imported(name: str) -> set[str]:
        tree = ast.parse((models / name).read_text())
        out = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                out.add(("." * node.level) + (node.module or ""))
            elif isinstance(node, ast.Import):
                out.update(a.name for a in node.names)
        return out

    assert ".tiny" in imported("build.py")
    for name in ("tiny.py", "assemble.py"):
        assert not {m for m in imported(name) if m.endswith("build") or m.endswith(".tiny")}, name
