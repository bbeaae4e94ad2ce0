"""RL checkpoint -> DeepGen SFT .pth: real 2-process ZeRO-2 shards, plain dit/ema safetensors, base merging,
overwrite protection, dtype, and xtuner's own loader."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from deepgen_rl.models import build_model
from deepgen_rl.checkpoints.sft import map_state_dict
from deepgen_rl.models.tiny import ensure_tiny_deepgen
from deepgen_rl.checkpoints.rl_format import atomic_torch_save, load_dit_state_dict

ROOT = Path(__file__).resolve().parents[2]
TINY_CONFIG = str(ROOT / "configs/models/deepgen_tiny.py")
SCRIPT = ROOT / "scripts/utils/rlckpt_to_sftckpt.py"
WORKER = ROOT / "tests/sft/zero2_checkpoint_worker.py"
META = {"format": "deepgen_rl.checkpoint.v1", "global_step": 3, "zero_stage": 0, "world_size": 1,
        "has_ema": True, "dit_dtype": "float32"}


def _load_script():
    spec = importlib.util.spec_from_file_location("rlckpt_to_sftckpt", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


converter = _load_script()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _xtuner_guess_load_checkpoint():
    """xtuner's own ``guess_load_checkpoint``. xtuner 0.2.0 pins transformers 4.48 and ``xtuner.model.utils`` fails to
    import on transformers 5.x (``xtuner.utils`` imports removed names), so fall back to executing just that
    function's source from the installed file (it only needs ``torch`` and ``os.path``)."""
    try:
        from xtuner.model.utils import guess_load_checkpoint
        return guess_load_checkpoint
    except ImportError:
        pass
    spec = importlib.util.find_spec("xtuner")  # finds the package without executing its __init__
    if spec is None or spec.origin is None:
        pytest.skip("xtuner is not installed (pip install --no-deps xtuner==0.2.0)")
    path = Path(spec.origin).parent / "model" / "utils.py"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    func = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "guess_load_checkpoint")
    namespace = {"torch": torch, "osp": os.path}
    exec(compile(ast.Module(body=[func], type_ignores=[]), str(path), "exec"), namespace)
    return namespace["guess_load_checkpoint"]


def _tensor_bytes(state_dict) -> int:
    return sum(t.numel() * t.element_size() for t in state_dict.values())


@pytest.fixture(scope="module")
def zero2_checkpoint(tmp_path_factory) -> Path:
    ensure_tiny_deepgen()  # build the cached tiny model once, before two processes race for it
    ckpt = tmp_path_factory.mktemp("rl") / "checkpoint-2"
    ckpt.mkdir()
    # TMPDIR: torchrun's per-launch torchelastic_* folder stays in the test's folder, not in /tmp
    env = dict(os.environ, OMP_NUM_THREADS="1", TMPDIR=str(tmp_path_factory.mktemp("tmpdir")))
    env.setdefault("TORCH_EXTENSIONS_DIR", str(ROOT / ".cache/torch_extensions"))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
           str(_free_port()), str(WORKER), str(ckpt)]
    result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return ckpt


@pytest.fixture(scope="module")
def base_checkpoint(tmp_path_factory) -> Path:
    """The tiny SFT checkpoint with every tensor shifted, so each part's origin is visible."""
    base = torch.load(ensure_tiny_deepgen()["checkpoint"], map_location="cpu", weights_only=True)
    gen = torch.Generator().manual_seed(0)
    shifted = {k: v + 0.5 + torch.rand(v.shape, generator=gen) if v.is_floating_point() else v
               for k, v in base.items()}
    assert any(".lora_" in k for k in shifted) and any(k.startswith("transformer.") for k in shifted)
    path = tmp_path_factory.mktemp("base") / "sft_base.pth"
    torch.save(shifted, path)
    return path


@pytest.mark.slow
def test_zero2_checkpoint_converts_exactly(zero2_checkpoint, base_checkpoint, tmp_path):
    reference = load_file(str(zero2_checkpoint / "reference_rank0.safetensors"))
    for k, v in load_file(str(zero2_checkpoint / "reference_rank1.safetensors")).items():
        assert torch.equal(v, reference[k])  # ZeRO-2 keeps identical full weights on every rank
    assert not (zero2_checkpoint / "dit.safetensors").exists()
    initial = build_model(TINY_CONFIG).transformer.state_dict()
    assert any(not torch.equal(initial[k], reference[k]) for k in reference), "the DeepSpeed steps changed nothing"

    # DiT only
    out = tmp_path / "rl_dit.pth"
    assert converter.main(["--rl_checkpoint", str(zero2_checkpoint), "--output", str(out)]) == 0
    converted = torch.load(out, map_location="cpu", weights_only=True)
    assert set(converted) == {f"transformer.{k}" for k in reference}
    model = build_model(TINY_CONFIG, checkpoint=str(out))
    trained = model.transformer.state_dict()
    assert set(trained) == set(reference)
    for k, v in reference.items():
        assert torch.equal(trained[k], v), k

    # xtuner's loader reads the same tensors
    guess_load_checkpoint = _xtuner_guess_load_checkpoint()
    via_xtuner = guess_load_checkpoint(str(out))
    assert set(via_xtuner) == set(converted)
    assert all(torch.equal(via_xtuner[k], converted[k]) for k in converted)

    # refuses to overwrite without --force, leaving the file untouched
    before = out.read_bytes()
    assert converter.main(["--rl_checkpoint", str(zero2_checkpoint), "--output", str(out), "--use_ema"]) == 1
    assert out.read_bytes() == before

    # merged into the (shifted) base: DiT from RL, everything else from the base
    merged_path = tmp_path / "merged.pth"
    assert converter.main(["--rl_checkpoint", str(zero2_checkpoint), "--output", str(merged_path),
                           "--base_checkpoint", str(base_checkpoint)]) == 0
    base = torch.load(base_checkpoint, map_location="cpu", weights_only=True)
    merged = torch.load(merged_path, map_location="cpu", weights_only=True)
    assert set(merged) == set(base)
    for k, v in merged.items():
        expected = reference[k[len("transformer."):]] if k.startswith("transformer.") else base[k]
        assert torch.equal(v, expected), k
    # the merged file alone (no default checkpoint) rebuilds the model: LoRA/connector/projectors from the base
    model = build_model(TINY_CONFIG, checkpoint=str(merged_path), default_checkpoint=None)
    own = model.state_dict()
    mapped, _, unexpected = map_state_dict({k: v for k, v in base.items() if not k.startswith("transformer.")},
                                           own.keys())
    assert not unexpected
    parts = {k.split(".")[0] for k in mapped}
    assert {"lmm", "connector", "projector_1", "projector_2", "projector_3", "meta_queries"} <= parts
    assert any(".lora_" in k for k in mapped)
    for k, v in mapped.items():
        assert torch.equal(own[k], v), k
    for k, v in reference.items():
        assert torch.equal(own[f"transformer.{k}"], v), k

    # --dtype bf16 halves the bytes (and the file); --force replaces the file
    assert converter.main(["--rl_checkpoint", str(zero2_checkpoint), "--output", str(out), "--dtype", "bf16",
                           "--force"]) == 0
    half = torch.load(out, map_location="cpu", weights_only=True)
    assert all(v.dtype == torch.bfloat16 for v in half.values())
    assert _tensor_bytes(half) * 2 == _tensor_bytes(converted)
    assert out.stat().st_size < 0.6 * len(before)
    for k, v in half.items():
        assert torch.equal(v, converted[k].to(torch.bfloat16))


def _write_plain_checkpoint(path: Path, dit: dict, ema: dict | None) -> None:
    path.mkdir(parents=True)
    save_file(dit, str(path / "dit.safetensors"))
    if ema is not None:
        save_file(ema, str(path / "ema_dit.safetensors"))
    (path / "checkpoint_meta.json").write_text(json.dumps(dict(META, has_ema=ema is not None)))


def test_plain_dit_and_ema_safetensors(tmp_path, capsys):
    initial = {k: v.contiguous() for k, v in build_model(TINY_CONFIG).transformer.state_dict().items()}
    dit = {k: v + 1.0 for k, v in initial.items()}
    ema = {k: v - 1.0 for k, v in initial.items()}
    ckpt = tmp_path / "checkpoint-3"
    _write_plain_checkpoint(ckpt, dit, ema)

    for use_ema, expected in ((False, dit), (True, ema)):
        loaded = load_dit_state_dict(ckpt, use_ema=use_ema)
        assert set(loaded) == set(expected) and all(torch.equal(loaded[k], expected[k]) for k in expected)
        out = tmp_path / f"out_ema{int(use_ema)}.pth"
        assert converter.main(["--rl_checkpoint", str(ckpt), "--output", str(out)]
                              + (["--use_ema"] if use_ema else [])) == 0
        printed = capsys.readouterr().out
        assert f"{len(expected)} tensors" in printed and ("ema_dit.safetensors" in printed) == use_ema
        model_dit = build_model(TINY_CONFIG, checkpoint=str(out)).transformer.state_dict()
        assert all(torch.equal(model_dit[k], expected[k]) for k in expected)

    # a `module.` prefix (engine around a wrapper) is stripped
    prefixed = tmp_path / "checkpoint-4"
    _write_plain_checkpoint(prefixed, {f"module.{k}": v for k, v in dit.items()}, None)
    assert set(load_dit_state_dict(prefixed)) == set(dit)
    with pytest.raises(FileNotFoundError, match="ema_dit.safetensors"):
        load_dit_state_dict(prefixed, use_ema=True)
    (prefixed / "checkpoint_meta.json").unlink()
    with pytest.raises(FileNotFoundError, match="checkpoint_meta.json"):
        load_dit_state_dict(prefixed)

    # a base whose DiT does not match is refused
    bad_base = tmp_path / "bad_base.pth"
    torch.save({"transformer.not_a_key": torch.zeros(1), "connector.x": torch.zeros(2)}, bad_base)
    with pytest.raises(ValueError, match="does not match"):
        converter.main(["--rl_checkpoint", str(ckpt), "--output", str(tmp_path / "x.pth"),
                        "--base_checkpoint", str(bad_base)])
    assert not (tmp_path / "x.pth").exists()


def test_cli_runs_as_a_script(tmp_path):
    ckpt = tmp_path / "checkpoint-1"
    _write_plain_checkpoint(ckpt, {"a.weight": torch.ones(2, 3), "b": torch.arange(4.0)}, None)
    out = tmp_path / "o.pth"
    result = subprocess.run([sys.executable, str(SCRIPT), "--rl_checkpoint", str(ckpt), "--output", str(out)],
                            capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "2 tensors" in result.stdout and "dit.safetensors" in result.stdout
    assert set(torch.load(out, weights_only=True)) == {"transformer.a.weight", "transformer.b"}
    again = subprocess.run([sys.executable, str(SCRIPT), "--rl_checkpoint", str(ckpt), "--output", str(out)],
                           capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert again.returncode == 1 and "--force" in again.stderr


def test_atomic_torch_save_leaves_no_partial_file(tmp_path):
    path = tmp_path / "f.pth"
    atomic_torch_save({"x": torch.ones(3)}, path)

    class Unpicklable:
        def __reduce__(self):
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        atomic_torch_save({"x": Unpicklable()}, path)
    assert torch.equal(torch.load(path, weights_only=True)["x"], torch.ones(3))  # old file intact
    assert [p.name for p in tmp_path.iterdir()] == ["f.pth"]  # temp file removed
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask  # not mkstemp's private 0600
