"""The toy DiT's update and rollout work with glibc's default malloc against ``scripts/utils/cpu_malloc.sh``'s settings.

    OMP_NUM_THREADS=1 python bench/cpu_malloc.py [--rows 64] [--iters 8] [--repeats 3] [--smoke]

Each arm is a fresh worker process (malloc settings are read when a process starts): "default" with every
``MALLOC_*`` variable removed, "cpu_malloc.sh" started through ``bash -c '. scripts/utils/cpu_malloc.sh; exec python
...'``, so the bench measures exactly what the scripts set. The arms alternate (``--repeats`` rounds). A worker
builds the toy headline model's DiT (``slots_wide``'s SD3 config, random weights: the work per step does not depend
on the weights) and times, on ``--rows`` images of 8x8x16 latents with 28 text tokens:
- a rollout forward (``torch.no_grad``), and
- an update piece: forward, backward, AdamW step (what the trainer does per train micro-batch),
``--iters`` times each after a warm-up, and counts its minor page faults per update piece (a count that varies from
run to run under glibc's default, whose mmap threshold moves with what was freed before). Before that it counts the
faults of one ``malloc`` / write / ``free`` of 64 MiB, after one warm-up, which does not vary: above glibc's largest
dynamic mmap threshold (32 MiB) the default maps and unmaps it each time, faulting in every page again (16,385 faults
with 4 KiB pages), while cpu_malloc.sh's 1 GiB threshold serves it from the heap it keeps (0). It also prints a digest
of the DiT's weights after its updates: both arms must give the same digest (the settings change where memory comes
from, not what is computed). Printed: the medians per arm and the ratios cpu_malloc.sh / default.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import ROOT, load_note, median, print_ratio, print_rerun, print_table, setup_env, timings  # noqa: E402

MALLOC_SH = ROOT / "scripts/utils/cpu_malloc.sh"
REALLOC_MIB = 64  # above glibc's largest dynamic mmap threshold (32 MiB on 64-bit)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=64, help="images per forward (the toy runs' micro-batch: 64)")
    p.add_argument("--iters", type=int, default=8, help="timed iterations per worker and kind")
    p.add_argument("--repeats", type=int, default=3, help="rounds of (default, cpu_malloc.sh) workers")
    p.add_argument("--smoke", action="store_true", help="2 iterations, 1 round (the bench tests)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def realloc_faults(mib: int = REALLOC_MIB) -> float:
    """Minor page faults of one libc malloc + memset + free of ``mib`` MiB, after one warm-up."""
    import ctypes

    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]

    def once():
        ptr = libc.malloc(mib << 20)
        if not ptr:
            raise MemoryError(f"malloc of {mib} MiB failed")
        ctypes.memset(ptr, 1, mib << 20)
        libc.free(ptr)

    once()
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    once()
    return float(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)


def worker(a) -> dict:
    realloc = realloc_faults()  # first, in a fresh process: nothing else has shaped the heap yet
    setup_env(1)
    import hashlib

    import torch

    from deepgen_rl.toy.model import VARIANTS
    from deepgen_rl.toy.pretrain import random_toy_dit

    torch.manual_seed(0)
    dit = random_toy_dit(VARIANTS["slots_wide"])
    opt = torch.optim.AdamW(dit.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(a.rows, 16, 8, 8, generator=g)
    ctx = torch.randn(a.rows, 28, dit.config.joint_attention_dim, generator=g)
    pooled = torch.randn(a.rows, dit.config.pooled_projection_dim, generator=g)
    t = torch.full((a.rows,), 500.0)

    def forward():
        return dit(hidden_states=x, encoder_hidden_states=ctx, pooled_projections=pooled, timestep=t,
                   return_dict=False)[0]

    def update():
        loss = forward().square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    with torch.no_grad():
        forward()
        fwd = timings(forward, a.iters)
    update()
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    upd = timings(update, a.iters)
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) / a.iters
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in dit.parameters())).hexdigest()[:16]
    return {"fwd_s": median(fwd), "update_s": median(upd), "faults_per_update": faults,
            "faults_per_realloc": realloc, "digest": digest}


def run_arm(arm: str, a) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--rows", str(a.rows), "--iters", str(a.iters)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    if arm != "default":
        cmd = ["bash", "-c", f'. "{MALLOC_SH}" && exec "$@"', "bash", *cmd]
    out = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{arm} worker failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.worker:
        print(json.dumps(worker(a)))
        return 0
    if a.smoke:
        a.iters, a.repeats = 2, 1
    print(load_note())
    arms = ["default", "cpu_malloc.sh"]
    res: dict[str, list[dict]] = {arm: [] for arm in arms}
    for _ in range(a.repeats):
        for arm in arms:
            res[arm].append(run_arm(arm, a))
    rows = []
    for arm in arms:
        r = res[arm]
        rows.append([arm, median(x["fwd_s"] for x in r) * 1e3, median(x["update_s"] for x in r) * 1e3,
                     median(x["faults_per_update"] for x in r), median(x["faults_per_realloc"] for x in r),
                     r[0]["digest"]])
    print_table(f"toy DiT (slots_wide config), {a.rows} rows, 1 thread; medians over {a.repeats} worker(s) x "
                f"{a.iters} iterations", ["arm", "rollout fwd ms", "update ms", "page faults / update",
                 f"faults / {REALLOC_MIB} MiB realloc", "weights digest"], rows, ["", ".1f", ".1f", ".0f", ".0f", ""])
    digests = {x["digest"] for arm in arms for x in res[arm]}
    same = "identical in every worker" if len(digests) == 1 else "DIFFER: " + str(digests)
    print(f"weights after the updates: {same}")
    print_ratio("rollout forward cpu_malloc.sh / default", rows[1][1] / rows[0][1])
    print_ratio("update piece cpu_malloc.sh / default", rows[1][2] / rows[0][2], "<= 1.0")
    print(load_note())
    print_rerun(__file__, threads=1)
    return 0 if len(digests) == 1 else 1


if __name__ == "__main__":
    raise SystemExit(main())
