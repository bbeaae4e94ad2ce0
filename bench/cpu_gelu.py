"""The toy DiT's rollout forward and update piece with ATen's tanh GELU against ``--cpu_fast_gelu``'s x·sigmoid(2u).

    OMP_NUM_THREADS=1 python bench/cpu_gelu.py [--rows 64] [--iters 8] [--repeats 3] [--smoke]

Two copies of one DiT (``slots_wide``'s SD3 config, the toy headline model's; random weights: the work does not depend
on them), one patched with ``deepgen_rl.models.deepgen.cpu_gelu.use_cpu_fast_gelu``. In one process, alternating
arm by arm for ``--repeats`` rounds, each times on ``--rows`` images of 8x8x16 latents with 28 text tokens:
- a rollout forward (``torch.no_grad``), and
- an update piece: forward, backward, AdamW step (what the trainer does per train micro-batch),
``--iters`` times after a warm-up; also one GELU alone on a (rows x 64 x 384) tensor, the feed-forward's hidden size.
Printed: medians per arm, the ratios fast / ATen, and how far apart the arms' outputs and gradients are (float
rounding: the same function, a different formula).
"""
from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import load_note, median, print_ratio, print_rerun, print_table, setup_env, timings  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=64, help="images per forward (the toy runs' micro-batch: 64)")
    p.add_argument("--iters", type=int, default=8, help="timed iterations per arm, kind and round")
    p.add_argument("--repeats", type=int, default=3, help="rounds of (ATen, fast) arms")
    p.add_argument("--smoke", action="store_true", help="8 rows, 2 iterations, 1 round (the bench tests)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.smoke:
        a.rows, a.iters, a.repeats = 8, 2, 1
    setup_env(1)
    import torch
    import torch.nn.functional as F

    from deepgen_rl.models.deepgen.cpu_gelu import tanh_gelu, use_cpu_fast_gelu
    from deepgen_rl.toy.model import VARIANTS
    from deepgen_rl.toy.pretrain import random_toy_dit

    print(load_note())
    torch.manual_seed(0)
    base = random_toy_dit(VARIANTS["slots_wide"])
    dits = {"aten": base, "fast": copy.deepcopy(base)}
    patched = use_cpu_fast_gelu(dits["fast"])
    opts = {k: torch.optim.AdamW(d.parameters(), lr=1e-4) for k, d in dits.items()}
    g = torch.Generator().manual_seed(1)
    x = torch.randn(a.rows, 16, 8, 8, generator=g)
    ctx = torch.randn(a.rows, 28, base.config.joint_attention_dim, generator=g)
    pooled = torch.randn(a.rows, base.config.pooled_projection_dim, generator=g)
    t = torch.linspace(900.0, 100.0, a.rows)
    hidden = torch.randn(a.rows * 64, 4 * base.config.caption_projection_dim, generator=g)
    gelus = {"aten": lambda: F.gelu(hidden, approximate="tanh"), "fast": lambda: tanh_gelu(hidden)}

    def forward(dit):
        return dit(hidden_states=x, encoder_hidden_states=ctx, pooled_projections=pooled, timestep=t,
                   return_dict=False)[0]

    def update(arm):
        forward(dits[arm]).square().mean().backward()
        opts[arm].step()
        opts[arm].zero_grad(set_to_none=True)

    # how far apart: outputs and first gradients (before any update)
    with torch.no_grad():
        out = {k: forward(d) for k, d in dits.items()}
    grads = {}
    for k, d in dits.items():
        forward(d).square().mean().backward()
        grads[k] = torch.cat([p.grad.reshape(-1) for p in d.parameters()])
        d.zero_grad(set_to_none=True)
    out_diff = (out["fast"] - out["aten"]).abs().max().item()
    grad_rel = ((grads["fast"] - grads["aten"]).norm() / grads["aten"].norm()).item()

    res = {arm: {"gelu": [], "fwd": [], "update": []} for arm in dits}
    for _ in range(a.repeats):
        for arm, dit in dits.items():
            with torch.no_grad():
                res[arm]["gelu"] += timings(gelus[arm], a.iters, warmup=1)
                res[arm]["fwd"] += timings(lambda: forward(dit), a.iters, warmup=1)
            res[arm]["update"] += timings(lambda: update(arm), a.iters, warmup=1)
    rows = [[arm, median(r["gelu"]) * 1e3, median(r["fwd"]) * 1e3, median(r["update"]) * 1e3]
            for arm, r in res.items()]
    print_table(f"toy DiT (slots_wide config, {patched} tanh GELUs), {a.rows} rows, 1 thread; medians over "
                f"{a.repeats} round(s) x {a.iters} iterations", ["arm", "one GELU ms", "rollout fwd ms", "update ms"],
                rows, ["", ".2f", ".1f", ".1f"])
    print(f"max |output fast - aten| {out_diff:.2e}; |grad fast - grad aten| / |grad aten| {grad_rel:.2e}")
    print_ratio("one GELU fast / aten", rows[1][1] / rows[0][1], "<= 1.0")
    print_ratio("rollout forward fast / aten", rows[1][2] / rows[0][2], "<= 1.0")
    print_ratio("update piece fast / aten", rows[1][3] / rows[0][3], "<= 1.0")
    print(load_note())
    print_rerun(__file__, threads=1)
    return 0 if out_diff < 1e-3 and grad_rel < 1e-3 else 1


if __name__ == "__main__":
    raise SystemExit(main())
