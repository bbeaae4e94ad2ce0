"""Sample efficiency on the toy world: held-out strict accuracy and claim score against training CPU-seconds, per
algorithm choice.

Arms (each a fresh copy of the pre-trained toy DeepGen, the same seed, prompts and eval noise; only the named flag
differs from the base arm ``cps/gdpo``):
  samplers   cps_sde (η 0.7, the toy world's; the recipe's is 1.0) | flowgrpo_sde (η 0.7) | dance_sde (η 0.3)
  advantages gdpo | grpo                                   (with cps_sde)
  trajectory full (timestep_fraction 0.6) | SDE window of 3 steps (Flow-GRPO-Fast style, cps_sde)
  control    blind: cps_sde + gdpo on the prompt-blind reward (``toy_compositional`` with ``blind=True``)
Each arm trains ``--steps`` MR-GRPO steps, evaluating held-out strict accuracy and claim score (ODE, fixed seeds;
assets/rl_datasets/toy/eval) at step 0 and every ``--eval_every`` steps. CPU-seconds = process CPU time spent in
training from the step-0 eval on (evaluation time excluded), measured with ``time.process_time`` around every
eval.
Prints three tables (strict accuracy; claim score — the mean fraction of an image's claims that pass, which moves
where strict accuracy is near 0; own − other, the part of the claim score a prompt-blind change would not raise — at
each eval + CPU-s), each with the gain per 100 CPU-s per arm, and writes a PNG with all three. The RL flags are
``deepgen_rl.toy.rl_run.TOY_RL_FLAGS`` (lr 3e-4, the exclusive reward) plus each arm's.

  python bench/toy_sample_efficiency.py                      # all 7 arms, 40 steps each
  python bench/toy_sample_efficiency.py --arms cps,flowgrpo  # a subset
  python bench/toy_sample_efficiency.py --smoke              # 2 arms x 2 steps (tests/bench)
  python bench/toy_sample_efficiency.py --model_dir /tmp/toy_slots --flags '{"learning_rate": 3e-4}'
                                                             # a built variant, other trainer flags for every arm
"""

from __future__ import annotations

import argparse
import inspect
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, load_note, print_rerun, print_table, setup_env  # noqa: E402

ARMS = {
    "cps": dict(atrain_sde_sampler="cps_sde", sde_eta=0.7),
    "flowgrpo": dict(atrain_sde_sampler="flowgrpo_sde", sde_eta=0.7),
    "dance": dict(atrain_sde_sampler="dance_sde", sde_eta=0.3),
    "grpo": dict(atrain_sde_sampler="cps_sde", sde_eta=0.7, atrain_adv_type="grpo"),
    "window": dict(atrain_sde_sampler="cps_sde", sde_eta=0.7, sde_window_size=3),
    # The control: cps/gdpo on the prompt-blind reward (each image scored against a random caption); what an arm
    # gains over it is prompt following (tests/toy/test_toy_rl.py).
    "blind": dict(atrain_sde_sampler="cps_sde", sde_eta=0.7,
                  reward_kwargs={"toy_compositional": {"exclusive": True, "blind": True}}),
}
ARMS["gdpo"] = ARMS["cps"]


def run_arm(name: str, steps: int, eval_every: int, workdir: Path, flags: dict, model_dir: str | None = None
            ) -> list[tuple[int, float, float, float, float]]:
    """[(step, training CPU-s so far, held-out strict accuracy, held-out claim score, its prompt-specific part)] of
    one arm. The prompt-specific part is the mean over prompts of own − other: the claim score of a prompt's images
    minus their score on 8 other held-out prompts (`deepgen_rl.toy.rl_run.ToyRLResult.per_prompt_other`), which a
    prompt-blind change (e.g. "draw every colour") does not raise."""
    import deepgen_rl.trainer.eval_hook as eval_hook
    from deepgen_rl.models import build_model
    from deepgen_rl.toy.model import model_dir_overrides
    from deepgen_rl.toy.rl_run import TOY_MODEL_CONFIG, run_toy_rl

    original = eval_hook.run_training_eval
    marks: list[tuple[int, float]] = []
    eval_cpu = [0.0]
    start = time.process_time()

    def timed_eval(*args, **kwargs):
        step = inspect.signature(original).bind(*args, **kwargs).arguments["step"]
        t0 = time.process_time()
        marks.append((step, t0 - start - eval_cpu[0]))
        try:
            return original(*args, **kwargs)
        finally:
            eval_cpu[0] += time.process_time() - t0

    eval_hook.run_training_eval = timed_eval
    try:
        model = build_model(TOY_MODEL_CONFIG, **(model_dir_overrides(model_dir) if model_dir else {}))
        start = time.process_time()
        res = run_toy_rl(workdir / name, steps=steps, eval_every=eval_every, model=model, **{**flags, **ARMS[name]})
    finally:
        eval_hook.run_training_eval = original
    acc = res.strict_acc("toy_heldout")
    zero = marks[0][1]  # CPU-s are counted from the step-0 eval: imports and trainer set-up are left out
    return [(s, cpu - zero, acc[s], res.evals[s]["toy_heldout"]["claim_score"], _specific(res, s))
            for s, cpu in marks if s in acc]


def _specific(res, step: int) -> float:
    own, other = res.per_prompt(step, "toy_heldout", "score"), res.per_prompt_other(step, "toy_heldout")
    return sum(own[i] - other[i] for i in own) / len(own)


METRICS = ((2, "held-out strict accuracy"), (3, "held-out claim score"),
           (4, "held-out own - other claim score"))


def plot(curves: dict[str, list[tuple[int, float, float, float, float]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(METRICS), figsize=(6 * len(METRICS), 4))
    for ax, (i, label) in zip(axes, METRICS):
        for name, pts in curves.items():
            ax.plot([p[1] for p in pts], [p[i] for p in pts], marker="o", label=name)
        ax.set_xlabel("training CPU-seconds (eval excluded)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arms", default="cps,flowgrpo,dance,gdpo,grpo,window,blind")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--eval_every", type=int, default=10)
    p.add_argument("--png", default=str(ROOT / "outputs" / "toy_sample_efficiency.png"))
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--smoke", action="store_true", help="2 arms x 2 steps, small batches")
    p.add_argument("--model_dir", default=None,
                   help="a toy model built elsewhere (python -m deepgen_rl.toy.model --variant NAME --out DIR) "
                        "instead of the default cache")
    p.add_argument("--flags", default="{}",
                   help="JSON object of trainer flags over TOY_RL_FLAGS for every arm (an arm's own flags win), "
                        "e.g. '{\"learning_rate\": 3e-4, \"rollout_global_batch_size\": 256}'")
    a = p.parse_args(argv)
    try:
        extra = json.loads(a.flags)
    except ValueError as e:
        p.error(f"--flags is not JSON: {e}")
    if not isinstance(extra, dict):
        p.error(f"--flags must be a JSON object of trainer flags, got {a.flags!r}")
    setup_env(a.threads)  # before torch-heavy imports (deepgen_rl.toy.model imports torch)
    if a.model_dir:
        from deepgen_rl.toy.model import model_dir_overrides

        try:
            model_dir_overrides(a.model_dir)
        except (FileNotFoundError, ValueError) as e:
            p.error(f"--model_dir: {e}")
    names = ["cps", "flowgrpo"] if a.smoke else [n.strip() for n in a.arms.split(",") if n.strip()]
    unknown = [n for n in names if n not in ARMS]
    if unknown:
        p.error(f"--arms: unknown {unknown}; choose from {sorted(ARMS)}")
    steps, every = (2, 2) if a.smoke else (a.steps, a.eval_every)
    flags = dict(rollout_micro_batch_size=16, atrain_micro_batch_size=16, rollout_n=4,
                 num_inference_steps=6) if a.smoke else {}
    flags.update(extra)
    print(load_note())
    workdir = Path(tempfile.mkdtemp(prefix="toy_bench_"))
    curves = {}
    try:
        for name in dict.fromkeys(names):  # "gdpo" and "cps" are the same arm: run once, report under both names
            key = "cps" if name == "gdpo" else name
            if key not in curves:
                curves[key] = run_arm(key, steps, every, workdir, flags, a.model_dir)
            curves[name] = curves[key]
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    curves = {n: curves[n] for n in names}
    evals = [pt[0] for pt in curves[names[0]]]
    for i, label in METRICS:
        rows = []
        for n, pts in curves.items():
            gain = (pts[-1][i] - pts[0][i]) / max(pts[-1][1], 1e-9) * 100
            rows.append([n] + [f"{pt[i]:.3f} @ {pt[1]:.0f}s" for pt in pts] + [f"{gain:+.3f}"])
        print_table(f"{label} @ training CPU-seconds", ["arm"] + [f"step {s}" for s in evals]
                    + ["gain / 100 CPU-s"], rows)
    png = Path(a.png)
    png.parent.mkdir(parents=True, exist_ok=True)
    plot(curves, png)
    print(f"wrote {png}")
    print(load_note())
    print_rerun(__file__, threads=a.threads)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
