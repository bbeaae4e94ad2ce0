"""Shared helpers of the benches: environment, the repo on sys.path, tables, medians, the rerun line, machine load."""

from __future__ import annotations

import math
import os
import shlex
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TINY_CONFIG = str(ROOT / "configs/models/deepgen_tiny.py")
DEMO_PROGRAMMATIC = str(ROOT / "assets/rl_datasets/demo/demo_programmatic.yaml")


@dataclass
class RolloutItem:
    """The PromptItem fields ``deepgen_rl.rollout.rollout()`` reads (what the rollout benches pass it)."""
    prompt: str
    dataset: str
    group_id: int
    prompt_index: int


def setup_env(threads: int) -> None:
    """Offline HF, ``threads`` intra-op threads, repo importable. Call before importing torch-heavy modules."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ["OMP_NUM_THREADS"] = str(threads)
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    import torch

    torch.set_num_threads(threads)


def median(values) -> float:
    values = list(values)
    return statistics.median(values) if values else float("nan")


def timings(fn, n: int, warmup: int = 0) -> list[float]:
    """Seconds of each of ``n`` calls of ``fn()`` (``time.perf_counter``), after ``warmup`` untimed calls."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def load_note() -> str:
    """'load 1.23 0.98 0.75 on N CPUs' (1/5/15-minute load averages), or '' where unavailable."""
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:
        return ""
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} CPUs"


def print_table(title: str, header: list[str], rows: list[list], formats: list[str] | None = None) -> None:
    """Fixed-width table: first column left-aligned, the others right-aligned; floats formatted by ``formats``."""
    formats = formats or [""] * len(header)
    def cell(v, f):
        if isinstance(v, float) and not math.isfinite(v):
            return "-"
        return format(v, f) if isinstance(v, float) and f else str(v)

    cells = [[cell(v, f) for v, f in zip(row, formats)] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(header)]

    def line(values):
        return " ".join(v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in enumerate(zip(values, widths)))

    print(f"\n{title}")
    print(line(header))
    print("-" * len(line(header)))
    for r in cells:
        print(line(r))


def print_ratio(name: str, value: float, target: str | None = None) -> None:
    """``RATIO name: 1.234x (target <= 1.10x: met)``: one grep-able line per ratio (the smoke tests parse them)."""
    verdict = ""
    if target is not None:
        op, bound = target.split()
        ok = value <= float(bound) if op == "<=" else value >= float(bound)
        verdict = f" (target {op} {bound}x: {'met' if ok and math.isfinite(value) else 'NOT met'})"
    print(f"RATIO {name}: {value:.3f}x{verdict}")


def print_rerun(script: str, argv: list[str] | None = None, threads: int | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    env = "HF_HUB_OFFLINE=1 " + (f"OMP_NUM_THREADS={threads} " if threads else "")
    tiny = os.environ.get("DEEPGEN_TINY_DIR")
    if tiny:
        env += f"DEEPGEN_TINY_DIR={shlex.quote(tiny)} "
    print("rerun: " + env + "python " + " ".join(shlex.quote(a) for a in [os.path.relpath(script, ROOT), *argv]))
