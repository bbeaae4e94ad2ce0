"""The toy model's build in one process against two single-threaded ranks (``build_ranks``), and against two threads.

    python bench/toy_build_ranks.py [--variant slots_wide] [--vae-steps 60] [--dit-steps 300] [--repeats 1] [--smoke]

Builds ``--variant``'s config, shortened to ``--vae-steps`` VAE and ``--dit-steps`` DiT steps, with the pinned
numerics of scripts/utils/pinned_numerics.sh, three ways, alternating for ``--repeats`` rounds: one process on one
thread (``build_ranks`` 1), one process on two threads (``OMP_NUM_THREADS=2``), two one-thread ranks
(``build_ranks`` 2). Each build runs in its own child (``python -m deepgen_rl.toy.model --out``, fresh folders);
printed: median wall and CPU seconds (``toy_meta.json``), the ratios to one process, and how far the two-rank and
two-thread models are from the one-process one (largest weight difference: float rounding, not another recipe).
On a 2-core machine nothing else may run meanwhile: the arms compete for the same cores.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import load_note, median, print_ratio, print_rerun, print_table, setup_env  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variant", default="slots_wide", help="the toy variant whose config is shortened")
    p.add_argument("--vae-steps", type=int, default=60, help="VAE steps (slots_wide's build: 600)")
    p.add_argument("--dit-steps", type=int, default=300, help="DiT steps (slots_wide's build: 2,400)")
    p.add_argument("--repeats", type=int, default=1, help="rounds of the three arms")
    p.add_argument("--smoke", action="store_true", help="2 VAE and 4 DiT steps on small pools, one round")
    return p.parse_args(argv)


ARMS = {"1 process, 1 thread": (1, 1), "1 process, 2 threads": (1, 2), "2 ranks, 1 thread each": (2, 1)}


def _build(cfg: dict, ranks: int, threads: int, out: str) -> dict:
    """One build of ``cfg`` in a pinned child with ``ranks`` ranks and ``threads`` threads; its toy_meta.json."""
    from deepgen_rl.toy.build_ranks import child_env
    from deepgen_rl.toy.model import PINNED_NUMERICS, PINNED_TAG, expected_numerics

    cfg_file = out + ".json"
    with open(cfg_file, "w") as f:
        json.dump(dict(cfg, build_ranks=ranks), f)
    env = child_env(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    if expected_numerics() == PINNED_TAG:
        env.update({k: v for k, v in PINNED_NUMERICS.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")})
    code = ("import json, sys; from deepgen_rl.toy.model import make_toy_deepgen; "
            "make_toy_deepgen(sys.argv[2], progress=False, config=json.load(open(sys.argv[1])))")
    subprocess.run([sys.executable, "-c", code, cfg_file, out], env=env, check=True)
    with open(os.path.join(out, "toy_meta.json")) as f:
        return json.load(f)


def main(argv=None) -> int:
    a = parse_args(argv)
    setup_env(1)
    from deepgen_rl.toy.model import trained_weights, variant_config

    cfg = dict(variant_config(a.variant), vae_steps=a.vae_steps, dit_steps=a.dit_steps)
    if a.smoke:
        cfg.update(vae_steps=2, vae_pool=8, dit_steps=4, dit_pool=8)
        a.repeats = 1
    print(load_note())
    res: dict[str, list[dict]] = {arm: [] for arm in ARMS}
    with tempfile.TemporaryDirectory(prefix="toy_build_ranks.") as tmp:
        for r in range(a.repeats):
            for i, (arm, (ranks, threads)) in enumerate(ARMS.items()):
                res[arm].append(_build(cfg, ranks, threads, os.path.join(tmp, f"{r}-{i}")))
        ref = trained_weights(os.path.join(tmp, "0-0"))
        diffs = {}
        for i, arm in enumerate(ARMS):
            w = trained_weights(os.path.join(tmp, f"0-{i}"))
            diffs[arm] = max(float((ref[k].float() - w[k].float()).abs().max()) for k in ref)
    rows = [[arm, median(m["build_wall_s"] for m in ms), median(m["build_cpu_s"] for m in ms),
             median(m["dit_final_loss"] for m in ms), diffs[arm]] for arm, ms in res.items()]
    print_table(f"toy build of {a.variant!r}, {cfg['vae_steps']} VAE + {cfg['dit_steps']} DiT steps, pinned numerics; "
                f"medians over {a.repeats} round(s)", ["arm", "wall s", "CPU s", "final loss", "max |w - w_1proc|"],
                rows, ["", ".1f", ".1f", ".6f", ".2e"])
    print_ratio("wall 2 threads / 1 process", rows[1][1] / rows[0][1], "<= 0.75")
    print_ratio("wall 2 ranks / 1 process", rows[2][1] / rows[0][1], "<= 0.6")
    print_ratio("CPU 2 ranks / 1 process", rows[2][2] / rows[0][2])
    print(load_note())
    print_rerun(__file__)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
