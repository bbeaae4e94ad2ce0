"""Find (and clear) stale JIT-build locks that would make a DeepSpeed start-up wait forever.

On CPU DeepSpeed JIT-compiles its shm comm op with ``torch.utils.cpp_extension.load``, which serialises builds
with ``torch.utils.file_baton.FileBaton``: the builder creates ``<build dir>/lock`` with ``O_CREAT | O_EXCL``,
keeps that file descriptor open for the whole build and deletes the file when it is done; every other process
spins (silently, without a timeout) until the file is gone. A run killed during the build leaves the file behind
and every later run waits on it forever.

A lock is *stale* when no live process on this machine has it open (Linux: no ``/proc/<pid>/fd/*`` link points at
it). Such a lock is removed when the folder is on a local filesystem. On a network filesystem (NFS, Lustre, …) a
process on another node could be building, which ``/proc`` cannot see: the lock is left alone and a one-line
warning says how long it has existed and how to remove it. ``DEEPGEN_BUILD_LOCK_CHECK=off`` skips the check;
``=warn`` only reports.

Build folders: ``$TORCH_EXTENSIONS_DIR/<op>/`` or, without it, ``<torch cache>/torch_extensions/<py>_<acc>/<op>/``.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

ENV = "DEEPGEN_BUILD_LOCK_CHECK"
LOCK_NAME = "lock"  # torch.utils.cpp_extension: FileBaton(os.path.join(build_directory, 'lock'))
NETWORK_FS = ("nfs", "nfs4", "cifs", "smb3", "smbfs", "lustre", "gpfs", "beegfs", "ceph", "glusterfs", "9p",
              "afs", "fuse")


@dataclass
class LockReport:
    """One ``lock`` file: who holds it and what the check did (``action``: held | removed | left)."""

    path: Path
    holders: list[int]
    age_s: float
    filesystem: str
    action: str
    message: str


def extension_roots() -> list[Path]:
    """Folders whose subfolders are torch JIT build directories (the first existing one of each kind)."""
    env = os.environ.get("TORCH_EXTENSIONS_DIR")
    if env:
        return [Path(env)]
    from torch.utils.cpp_extension import get_default_build_root

    return [Path(get_default_build_root())]


def find_locks(root: Path) -> list[Path]:
    """``lock`` files at ``root/<op>/lock`` or ``root/<py>_<acc>/<op>/lock``."""
    if not root.is_dir():
        return []
    return sorted(p for pattern in (f"*/{LOCK_NAME}", f"*/*/{LOCK_NAME}") for p in root.glob(pattern) if p.is_file())


def open_by(path: Path, proc: Path = Path("/proc")) -> list[int] | None:
    """PIDs of live processes with ``path`` open (those /proc lets us read), None where /proc is unavailable."""
    if not (proc / "self" / "fd").is_dir():
        return None
    target = os.path.realpath(path)
    pids = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fds = list((entry / "fd").iterdir())
        except OSError:  # not ours, or gone
            continue
        for fd in fds:
            try:
                if os.readlink(fd) == target:
                    pids.append(int(entry.name))
                    break
            except OSError:
                continue
    return pids


def filesystem_type(path: Path, mounts: Path = Path("/proc/self/mounts")) -> str:
    """Type of the filesystem holding ``path`` (longest matching mount point), "unknown" without /proc."""
    try:
        lines = mounts.read_text().splitlines()
    except OSError:
        return "unknown"
    target, best, kind = os.path.realpath(path), "", "unknown"
    for line in lines:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) > len(best):
            best, kind = point, fields[2]
    return kind


def _is_network(kind: str) -> bool:
    return kind == "unknown" or any(kind == n or kind.startswith(n + ".") for n in NETWORK_FS)


def check_build_locks(roots: list[Path] | None = None, mode: str | None = None,
                      proc: Path = Path("/proc"), mounts: Path = Path("/proc/self/mounts")) -> list[LockReport]:
    """Inspect every JIT build lock under ``roots``; remove stale local ones (see the module docstring).

    ``mode``: "remove" (default) | "warn" | "off", from ``$DEEPGEN_BUILD_LOCK_CHECK`` when None.
    Returns one report per lock found; each non-held lock is also logged as a warning.
    """
    mode = (mode or os.environ.get(ENV) or "remove").lower()
    if mode not in ("remove", "warn", "off"):
        raise ValueError(f"{ENV} must be remove, warn or off, got {mode!r}")
    if mode == "off":
        return []
    reports = []
    for root in roots if roots is not None else extension_roots():
        for lock in find_locks(Path(root)):
            try:
                age = time.time() - lock.stat().st_mtime
            except FileNotFoundError:  # the builder just finished
                continue
            holders = open_by(lock, proc)
            kind = filesystem_type(lock, mounts)
            if holders:
                reports.append(LockReport(lock, holders, age, kind, "held",
                                          f"build lock {lock} is held by pid {holders}: a build is running"))
                continue
            how = f"remove it with: rm {lock}" if holders is None else f"rm {lock}"
            if mode == "remove" and holders is not None and not _is_network(kind):
                try:
                    lock.unlink()
                    action, msg = "removed", (f"removed stale JIT build lock {lock} ({age:.0f} s old, no live "
                                              f"process holds it: a killed build left it)")
                except FileNotFoundError:
                    continue
            else:
                if holders is None:
                    why = "/proc is unavailable, so its holder cannot be checked"
                elif _is_network(kind):
                    why = (f"no process on this machine holds it, but its {kind} filesystem may be shared with "
                           "other nodes")
                else:
                    why = f"no live process holds it ({ENV}={mode} leaves it)"
                action, msg = "left", (f"JIT build lock {lock} ({age:.0f} s old) will make DeepSpeed wait "
                                       f"forever unless a build is running: {why}; if none is, {how}")
            logger.warning(msg)
            reports.append(LockReport(lock, [] if holders is None else holders, age, kind, action, msg))
    return reports
