"""Stale torch JIT-build locks: detected in well under a second, removed when no live process holds them.

The locks are real ``torch.utils.file_baton.FileBaton`` locks, the mechanism ``cpp_extension.load`` (and so
DeepSpeed's op builder) uses; the waiter is FileBaton.wait itself, which without the check never returns.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch.utils.file_baton as file_baton
from torch.utils.file_baton import FileBaton

from deepgen_rl.utils import dist
from deepgen_rl.utils.build_lock import check_build_locks, filesystem_type

pytestmark = pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs Linux /proc")
# torch's own file_baton.py, loaded by path in the child processes (it needs only os/time; importing torch is slow)
_BATON = ("import importlib.util, os, sys, time; spec = importlib.util.spec_from_file_location('fb', sys.argv[2]); "
          "fb = importlib.util.module_from_spec(spec); spec.loader.exec_module(fb); b = fb.FileBaton(sys.argv[1]); ")


def _stale_lock(root: Path, op: str = "deepspeed_shm_comm") -> Path:
    """What a build killed after FileBaton.try_acquire leaves: the file, no process holding it."""
    (root / op).mkdir(parents=True)
    lock = root / op / "lock"
    code = _BATON + "assert b.try_acquire(); os._exit(9)"  # dies mid-build, never releases
    subprocess.run([sys.executable, "-c", code, str(lock), file_baton.__file__], check=False, timeout=60)
    assert lock.exists()
    return lock


def test_stale_lock_is_removed_and_a_waiting_build_proceeds(tmp_path):
    lock = _stale_lock(tmp_path / "ext")
    waiter = threading.Thread(target=FileBaton(str(lock), wait_seconds=0.01).wait, daemon=True)
    waiter.start()
    waiter.join(0.3)
    assert waiter.is_alive()  # the hang: FileBaton.wait spins as long as the file exists
    t0 = time.monotonic()
    reports = check_build_locks([tmp_path / "ext"], mode="remove")
    assert time.monotonic() - t0 < 5.0
    assert [(r.path, r.action) for r in reports] == [(lock, "removed")] and not lock.exists()
    waiter.join(5.0)
    assert not waiter.is_alive()
    assert check_build_locks([tmp_path / "ext"], mode="remove") == []  # idempotent


def test_a_lock_held_by_a_live_build_is_left_alone(tmp_path):
    (tmp_path / "ext/op").mkdir(parents=True)
    lock = tmp_path / "ext/op/lock"
    code = _BATON + "assert b.try_acquire(); print('held', flush=True); time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", code, str(lock), file_baton.__file__], stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        reports = check_build_locks([tmp_path / "ext"], mode="remove")
        assert [(r.action, r.holders) for r in reports] == [("held", [proc.pid])] and lock.exists()
    finally:
        proc.kill()
        proc.wait()


def test_network_filesystem_and_warn_mode_only_say_what_to_do(tmp_path):
    lock = _stale_lock(tmp_path / "ext")
    mounts = tmp_path / "mounts"
    mounts.write_text(f"/dev/sda1 / ext4 rw 0 0\nserver:/home {tmp_path} nfs4 rw 0 0\n")
    assert filesystem_type(lock, mounts) == "nfs4"
    (report,) = check_build_locks([tmp_path / "ext"], mode="remove", mounts=mounts)
    assert report.action == "left" and lock.exists()
    assert f"rm {lock}" in report.message and "nfs4" in report.message
    local = tmp_path / "local_mounts"
    local.write_text(f"/dev/sda1 / ext4 rw 0 0\n/dev/sdb1 {tmp_path} xfs rw 0 0\n")
    (report,) = check_build_locks([tmp_path / "ext"], mode="warn", mounts=local)
    assert report.action == "left" and lock.exists() and f"rm {lock}" in report.message
    assert check_build_locks([tmp_path / "ext"], mode="off") == []
    with pytest.raises(ValueError, match="DEEPGEN_BUILD_LOCK_CHECK"):
        check_build_locks([tmp_path / "ext"], mode="sometimes")
    (report,) = check_build_locks([tmp_path / "ext"], mode="remove", mounts=local)
    assert report.action == "removed" and not lock.exists()


def test_start_up_clears_the_lock_under_torch_extensions_dir(tmp_path, monkeypatch):
    """Both layouts: $TORCH_EXTENSIONS_DIR/<op>/lock and <root>/<py>_<acc>/<op>/lock."""
    flat = _stale_lock(tmp_path / "ext")
    nested = _stale_lock(tmp_path / "ext" / "py311_cpu", op="other_op")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.delenv("DEEPGEN_BUILD_LOCK_CHECK", raising=False)
    if filesystem_type(tmp_path) in ("unknown",):
        pytest.skip("cannot tell the filesystem of tmp_path")
    dist.init_process_group_if_needed()
    assert not flat.exists() and not nested.exists()
