"""The toy-model cache: one build at a time (a second process waits for the first and uses its result), a stale
cache is replaced, and an unrelated folder is never overwritten. The build itself is replaced by a fast stand-in."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import time

import pytest

from deepgen_rl.toy import model as toy_model


def _fake_make(out_dir: str, progress: bool = True, config=None):
    """Stand-in for the minutes-long build: writes the done marker after a delay and counts builds in a log."""
    time.sleep(float(os.environ["FAKE_BUILD_S"]))
    with open(os.environ["FAKE_BUILD_LOG"], "a") as f:
        f.write(f"{os.getpid()}\n")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, toy_model.DONE_MARKER), "w") as f:
        json.dump({"version": toy_model.TOY_VERSION, "config_hash": toy_model.config_hash()}, f)
    return toy_model.toy_paths(out_dir)


def _ensure_in_child(queue) -> None:
    toy_model.make_toy_deepgen = _fake_make
    queue.put(toy_model.ensure_toy_deepgen(progress=False)["root"])


@pytest.fixture
def fake_build(tmp_path, monkeypatch):
    monkeypatch.setenv("DEEPGEN_TOY_DIR", str(tmp_path / "toy"))
    monkeypatch.setenv("FAKE_BUILD_LOG", str(tmp_path / "builds.log"))
    monkeypatch.setenv("FAKE_BUILD_S", "1.5")
    monkeypatch.setattr(toy_model, "make_toy_deepgen", _fake_make)
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
    other = fake_build / "other"
    other.mkdir()
    (other / "precious.txt").write_text("keep me")
    monkeypatch.setenv("DEEPGEN_TOY_DIR", str(other))
    with pytest.raises(FileExistsError, match="not a toy-model cache"):
        toy_model.ensure_toy_deepgen(progress=False)
    assert (other / "precious.txt").read_text() == "keep me"
