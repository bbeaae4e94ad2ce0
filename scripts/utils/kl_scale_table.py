"""Per-step factor between our exact Gaussian KL and the original's for ``flowgrpo_sde`` (docs/recipe.md).

Ours divides the squared mean difference by 2·std² with std = s·√|Δt| (the transition's real std); the original, as
Flow-GRPO, divides by 2·s². Ratio ours / original = 1/|Δt|, Δt = σ_{j+1} − σ_j on the recipe's schedule
(``make_sigmas(T, shift)``, the same sigmas as diffusers' FlowMatchEulerDiscreteScheduler).

    python scripts/utils/kl_scale_table.py [--steps 50] [--shift 3.0]     # prints the markdown table
"""

from __future__ import annotations

import argparse

from deepgen_rl.rl.samplers import make_sigmas


def kl_scale_rows(num_steps: int = 50, shift: float = 3.0) -> list[tuple[int, float, float, float]]:
    """(step j, σ_j, σ_{j+1}, 1/|Δt|) for the trainable steps j = 0 … T−2 (the last step, to σ = 0, is never trained)."""
    sig = make_sigmas(num_steps, shift).double()
    return [(j, float(sig[j]), float(sig[j + 1]), 1.0 / float(sig[j] - sig[j + 1])) for j in range(num_steps - 1)]


def markdown(rows) -> str:
    lines = ["| step j | σ_j | σ_j+1 | ours / original = 1/\\|Δt\\| |", "|---|---|---|---|"]
    lines += [f"| {j} | {s:.4f} | {n:.4f} | {f:.1f} |" for j, s, n, f in rows]
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--shift", type=float, default=3.0)
    a = parser.parse_args()
    print(markdown(kl_scale_rows(a.steps, a.shift)))
