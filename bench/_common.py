"""Shared helpers of the benches: environment, the repo on sys.path, tables, medians, the rerun line, machine load."""

from __future__ import annotations

import math
import os
import shlex
import statistics
import sys
import time
from contextlib import contextmanager
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


TINY_PROMPTS = ["a red apple on a table", "a blue car in the rain"]  # what the rollout benches give the tiny model


def add_rollout_args(p, *, groups: int, repeats: int) -> None:
    """The rollout benches' common options (model, T, groups x rollout-n images, micro-batch, size, alternating
    rounds, threads, --smoke); ``apply_rollout_smoke`` then applies --smoke's settings."""
    p.add_argument("--model", default="toy", choices=["toy", "tiny"])
    p.add_argument("--T", type=int, default=8, help="rollout steps (the toy runs: 8)")
    p.add_argument("--groups", type=int, default=groups, help="prompts per rollout")
    p.add_argument("--rollout-n", type=int, default=8, help="images per prompt")
    p.add_argument("--micro-batch", type=int, default=64, help="rollout micro-batch size")
    p.add_argument("--size", type=int, default=64, help="image side in pixels")
    p.add_argument("--repeats", type=int, default=repeats, help="alternating rounds per window start")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (OMP_NUM_THREADS)")
    p.add_argument("--smoke", action="store_true", help="tiny preset, 32 px, T=4, 2 groups x 4 (seconds)")


def apply_rollout_smoke(args) -> None:
    """--smoke: the tiny preset, 32 px, T = 4, 2 groups x 4 images in one micro-batch, one round."""
    if args.smoke:
        args.model, args.T, args.groups, args.rollout_n, args.micro_batch, args.size, args.repeats = \
            "tiny", 4, 2, 4, 8, 32, 1


def load_rollout_model(name: str, smoke: bool, toy_variant: str):
    """The tiny random DeepGen ("tiny": its "tiny" preset with ``smoke``, else "small") or the cached toy DeepGen
    of ``toy_variant`` ("toy", built once if absent)."""
    from deepgen_rl.models import build_model

    if name == "tiny":
        return build_model(TINY_CONFIG, tiny_preset="tiny" if smoke else "small")
    from deepgen_rl.toy.model import ensure_toy_deepgen, model_dir_overrides
    from deepgen_rl.toy.rl_run import TOY_MODEL_CONFIG

    root = ensure_toy_deepgen(progress=True, variant=toy_variant)["root"]
    return build_model(TOY_MODEL_CONFIG, **model_dir_overrides(root))


@contextmanager
def counting_dit_rows(model):
    """Within the block, ``model.predict_velocity`` appends the rows of each DiT call to the yielded list."""
    rows: list[int] = []
    orig = model.predict_velocity

    def counting(latents, sigma, cond, transformer=None):
        rows.append(latents.shape[0])
        return orig(latents, sigma, cond, transformer=transformer)

    model.predict_velocity = counting
    try:
        yield rows
    finally:
        del model.predict_velocity  # the class's method again


def timed_window_rollout(model, items, args, sigmas, start: int, window: int, **options):
    """One rollout of ``items`` with the rollout benches' settings (``add_rollout_args``: T, images per prompt,
    micro-batch, size), cps_sde at eta 0.7, one initial noise per group, an SDE window of ``window`` steps from
    ``start`` and ``options`` (the arm's rollout keywords): (seconds, DiT rows, the batch)."""
    import torch

    from deepgen_rl.rl.samplers import DEFAULT_SDE_SAMPLER, stochastic_step_mask
    from deepgen_rl.rollout import rollout

    stochastic = torch.tensor(stochastic_step_mask(args.T, (start, start + window)))
    with counting_dit_rows(model) as rows:
        t = time.perf_counter()
        batch = rollout(model, items, rollout_n=args.rollout_n, micro_batch_size=args.micro_batch, sigmas=sigmas,
                        stochastic=stochastic, sampler=DEFAULT_SDE_SAMPLER, eta=0.7, init_same_noise=True,
                        height=args.size, width=args.size, seed=0, step=start, rank=0, **options)
        dt = time.perf_counter() - t
    return dt, sum(rows), batch


def setup_env(threads: int) -> None:
    """Offline HF, ``threads`` intra-op threads, repo importable. Call before importing torch-heavy modules."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ["OMP_NUM_THREADS"] = str(threads)
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    import torch

    torch.set_num_threads(threads)


def run_under_torchrun(script: str, nproc: int) -> None:
    """Start ``nproc`` processes of ``script`` (with this process's arguments) under ``torch.distributed.run`` on a
    free port, and exit with their status (the last 6,000 characters of their stderr on a failure). torchrun's
    per-launch folder goes into a temporary ``--log-dir`` that is removed after (without it every launch leaves a
    /tmp/torchelastic_* folder behind)."""
    import subprocess
    import tempfile

    from deepgen_rl.services.ocr.launch import free_port

    with tempfile.TemporaryDirectory(prefix="bench_torchrun.") as logs:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_port",
               str(free_port()), "--log-dir", logs, script, *sys.argv[1:]]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
        proc = subprocess.run(cmd, env=env, stderr=subprocess.PIPE, text=True)
    if proc.returncode:
        sys.stderr.write(proc.stderr[-6000:])
    sys.exit(proc.returncode)


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
