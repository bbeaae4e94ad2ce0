"""The toy-model cache: one build at a time (a second process waits for the first and uses its result), a stale
cache is replaced, and an unrelated folder is never overwritten. The build itself is replaced by a fast stand-in."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from deepgen_rl.toy import model as toy_model

# the tests of the pinned build: only an x86-64 machine with AVX2 can pin its numerics
needs_pinned_numerics = pytest.mark.skipif(
    toy_model.expected_numerics() != toy_model.PINNED_TAG,
    reason=f"this machine cannot pin the build's numerics ({toy_model.expected_numerics()})")


def _fake_make(out_dir: str, progress: bool = True, variant: str = "default"):
    """Stand-in for the minutes-long (pinned) build: writes the done marker after a delay and counts builds."""
    time.sleep(float(os.environ["FAKE_BUILD_S"]))
    with open(os.environ["FAKE_BUILD_LOG"], "a") as f:
        f.write(f"{os.getpid()}\n")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, toy_model.DONE_MARKER), "w") as f:
        json.dump({"version": toy_model.TOY_VERSION, "numerics": toy_model.expected_numerics(),
                   "config_hash": toy_model.config_hash(toy_model.variant_config(variant))}, f)
    return toy_model.toy_paths(out_dir)


def _ensure_in_child(queue) -> None:
    toy_model.build_toy_deepgen = _fake_make
    queue.put(toy_model.ensure_toy_deepgen(progress=False)["root"])


@pytest.fixture
def fake_build(tmp_path, monkeypatch):
    monkeypatch.setenv("DEEPGEN_TOY_DIR", str(tmp_path / "toy"))
    monkeypatch.setenv("FAKE_BUILD_LOG", str(tmp_path / "builds.log"))
    monkeypatch.setenv("FAKE_BUILD_S", "1.5")
    monkeypatch.setattr(toy_model, "build_toy_deepgen", _fake_make)
    return tmp_path


def _builds(tmp_path) -> int:
    log = tmp_path / "builds.log"
    return len(log.read_text().split()) if log.exists() else 0


def test_concurrent_callers_build_once_and_share_the_result(fake_build, capfd):
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_ensure_in_child, args=(queue,)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    roots = {queue.get(timeout=5) for _ in procs}
    assert all(p.exitcode == 0 for p in procs)
    assert roots == {str(fake_build / "toy")} and _builds(fake_build) == 1
    assert "another process is building the toy DeepGen" in capfd.readouterr().err
    assert toy_model.ensure_toy_deepgen() and _builds(fake_build) == 1  # current: nothing rebuilt


def test_a_stale_cache_is_rebuilt_and_a_foreign_folder_refused(fake_build, monkeypatch):
    root = fake_build / "toy"
    root.mkdir()
    (root / toy_model.DONE_MARKER).write_text(json.dumps({"version": "toy-v0", "config_hash": "old"}))
    monkeypatch.setenv("FAKE_BUILD_S", "0")
    toy_model.ensure_toy_deepgen(progress=False)
    assert _builds(fake_build) == 1 and toy_model.read_meta(str(root))["version"] == toy_model.TOY_VERSION
    # a current version and config built with other numerics (e.g. natively, before builds were pinned) is stale too
    meta = dict(toy_model.read_meta(str(root)), numerics="native-avx512")
    (root / toy_model.DONE_MARKER).write_text(json.dumps(meta))
    toy_model.ensure_toy_deepgen(progress=False)
    assert _builds(fake_build) == 2 and toy_model.read_meta(str(root))["numerics"] == toy_model.expected_numerics()
    other = fake_build / "other"
    other.mkdir()
    (other / "precious.txt").write_text("keep me")
    monkeypatch.setenv("DEEPGEN_TOY_DIR", str(other))
    with pytest.raises(FileExistsError, match="not a toy-model cache"):
        toy_model.ensure_toy_deepgen(progress=False)
    assert (other / "precious.txt").read_text() == "keep me"


def test_a_variant_has_its_own_cache_and_another_variants_build_is_never_replaced(fake_build, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_BUILD_S", "0")
    monkeypatch.delenv("DEEPGEN_TOY_DIR")
    monkeypatch.delenv("DEEPGEN_TINY_DIR", raising=False)
    monkeypatch.setenv("HOME", str(fake_build / "home"))
    monkeypatch.setenv("DEEPGEN_TOY_VARIANT", "slots")
    root = toy_model.ensure_toy_deepgen(progress=False)["root"]
    assert root.endswith(f"{toy_model.TOY_VERSION}-slots") and _builds(fake_build) == 1
    assert toy_model.read_meta(root)["config_hash"] == toy_model.config_hash(toy_model.VARIANTS["slots"])
    assert toy_model.meta_variant(toy_model.read_meta(root)) == "slots"
    toy_model.ensure_toy_deepgen(progress=False)
    assert _builds(fake_build) == 1  # current: not rebuilt
    # the CLI without --out builds into the same cache
    assert toy_model.main(["--variant", "slots", "--no_progress"]) == 0 and _builds(fake_build) == 1
    assert root in capsys.readouterr().out
    # DEEPGEN_TOY_DIR pointed at that build while asking for the default: refused before any build, nothing lost
    monkeypatch.setenv("DEEPGEN_TOY_DIR", root)
    monkeypatch.delenv("DEEPGEN_TOY_VARIANT")
    with pytest.raises(FileExistsError, match="DEEPGEN_TOY_VARIANT=slots"):
        toy_model.ensure_toy_deepgen(progress=False)
    assert _builds(fake_build) == 1 and toy_model.meta_variant(toy_model.read_meta(root)) == "slots"
    monkeypatch.setenv("DEEPGEN_TOY_VARIANT", "no_such_variant")
    with pytest.raises(ValueError, match="not a toy variant"):
        toy_model.toy_variant()


@needs_pinned_numerics
def test_a_child_with_the_pinned_environment_runs_avx2_kernels():
    """What the pinned build relies on: a process started with PINNED_NUMERICS runs torch's AVX2 kernels (and so
    `_running_pinned` holds in the build's child), whatever this process runs."""
    code = "import torch; from deepgen_rl.toy.model import _running_pinned as p; " \
           "print(torch.backends.cpu.get_cpu_capability(), p())"
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, **toy_model.PINNED_NUMERICS},
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == ["AVX2", "True"]


_NPY_AVX512 = ("X86_V4", "AVX512_ICL", "AVX512_SPR")  # numpy >= 2.4's AVX-512 dispatch groups


def _numpy_features(env: dict) -> dict:
    code = "import json; from numpy._core._multiarray_umath import __cpu_features__ as f; print(json.dumps(f))"
    return json.loads(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                     check=True).stdout)


@needs_pinned_numerics
def test_a_child_with_the_pinned_environment_runs_numpys_avx2_loops_at_most():
    """numpy picks its SIMD loops at import, and the toy reward's scores change in the last bits with them (measured:
    the 512 images of an eval scored 385.88360591232777 with X86_V3 loops, 385.8836059272289 with X86_V2 ones), so
    a two-rank RL run diverges between an AVX-512 and an AVX2 machine unless numpy is held to AVX2 as well. On an
    AVX-512 machine this checks the pin itself; on an AVX2 one, that numpy reads the variable (adding X86_V3 to it
    turns the AVX2 loops off)."""
    pinned = _numpy_features({**os.environ, **toy_model.PINNED_NUMERICS})
    assert not any(pinned.get(g, False) for g in _NPY_AVX512), pinned
    assert pinned["AVX2"] and pinned["FMA3"]  # the AVX2 loops stay on: the pin only removes AVX-512
    if pinned.get("X86_V3"):
        lower = {**os.environ, **toy_model.PINNED_NUMERICS,
                 "NPY_DISABLE_CPU_FEATURES": toy_model.PINNED_NUMERICS["NPY_DISABLE_CPU_FEATURES"] + " X86_V3"}
        assert _numpy_features(lower)["X86_V3"] is False


@needs_pinned_numerics
def test_pinned_numerics_sh_exports_what_the_build_pins(tmp_path):
    """scripts/utils/pinned_numerics.sh (sourced by scripts/test.sh and the toy script, which set OMP_NUM_THREADS
    themselves) and PINNED_NUMERICS must agree: `_running_pinned` compares them, and a mismatch would make every
    build respawn a child, or hold one library to AVX2 in training but not in the build."""
    root = Path(toy_model.__file__).resolve().parents[2]
    clean = {k: v for k, v in os.environ.items() if k not in toy_model.PINNED_NUMERICS}
    out = subprocess.run(["bash", "-c", ". scripts/utils/pinned_numerics.sh && env -0"], cwd=root, env=clean,
                         capture_output=True, text=True, check=True).stdout
    exported = dict(kv.split("=", 1) for kv in out.split("\0") if "=" in kv)
    expected = {k: v for k, v in toy_model.PINNED_NUMERICS.items() if k != "OMP_NUM_THREADS"}
    assert {k: exported.get(k) for k in expected} == expected
    assert "OMP_NUM_THREADS" not in exported


@needs_pinned_numerics
def test_an_unpinned_process_builds_in_a_pinned_child_and_a_failed_child_is_an_error(tmp_path, monkeypatch):
    calls = []

    def fake_run(cmd, env, check):
        calls.append((cmd, env))
        out = cmd[cmd.index("--out") + 1]
        if "fail" in out:
            return type("Done", (), {"returncode": 3})()
        os.makedirs(out)
        with open(os.path.join(out, toy_model.DONE_MARKER), "w") as f:
            json.dump({"numerics": toy_model.PINNED_TAG}, f)
        return type("Done", (), {"returncode": 0})()

    monkeypatch.setattr(toy_model, "_running_pinned", lambda: False)
    monkeypatch.setattr(toy_model.subprocess, "run", fake_run)
    monkeypatch.delenv(toy_model._PINNED_CHILD, raising=False)
    out = tmp_path / "built"
    out.mkdir()  # an empty folder (what _build_into makes) is handed over to the child
    assert toy_model.build_toy_deepgen(str(out), progress=False, variant="slots")["root"] == str(out)
    (cmd, env), = calls
    assert cmd[1:] == ["-m", "deepgen_rl.toy.model", "--variant", "slots", "--out", str(out), "--no_progress"]
    assert {k: env[k] for k in toy_model.PINNED_NUMERICS} == toy_model.PINNED_NUMERICS
    assert env[toy_model._PINNED_CHILD] == "1"
    with pytest.raises(RuntimeError, match="pinned toy build .* failed with exit status 3"):
        toy_model.build_toy_deepgen(str(tmp_path / "fail"), progress=False)
    # a child that does not run pinned refuses instead of spawning another
    monkeypatch.setenv(toy_model._PINNED_CHILD, "1")
    with pytest.raises(RuntimeError, match="does not run pinned"):
        toy_model.build_toy_deepgen(str(tmp_path / "child"), progress=False)
    assert len(calls) == 2
