"""Sample efficiency on the toy world: held-out strict accuracy and claim scores against training CPU-seconds, per
algorithm choice.

Two settings (``--setting``):
  prompt_following (default) the headline setting of scripts/toy_prompt_following.sh and CI's RL test: the
                   ``slots_wide`` model, ``deepgen_rl.toy.rl_run.PROMPT_FOLLOWING_FLAGS`` (cps_sde η 0.7, gdpo,
                   1,024 images per step, a one-step SDE window in steps 3-5, the SFT anchor, the exclusive
                   ``soft_color`` reward), its RL prompt mixture and the 64 held-out prompts x 8 images; 20 steps per
                   arm, eval every 10. Here RL measurably teaches prompt following (docs/toy_world.md).
  fast             the old default: the default toy model (toy-v3), ``TOY_RL_FLAGS`` (64 images per step, full
                   trajectory), 64 held-out prompts x 2 images; 40 steps, eval every 10. ~1.5 CPU-s per step, but on
                   toy-v3 no arm's gain is shown to be prompt following (bench/README.md).
Arms (each a fresh copy of the setting's model, the same seed, prompts and eval noise; only the named flags differ
from the setting's base arm ``cps``):
  samplers    cps (cps_sde η 0.7) | flowgrpo (flowgrpo_sde η 0.7) | dance (dance_sde η 0.3)
  advantages  gdpo (= cps) | grpo (cps_sde, grpo advantages)
  trajectory  prompt_following: window (= cps: one SDE step in steps 3-5) | full (the whole trajectory,
              timestep_fraction 0.6); fast: full (= cps) | window (an SDE window of 3, Flow-GRPO-Fast style)
  control     blind: the base arm on the prompt-blind reward (``toy_compositional`` with ``blind=True``: each image
              scored against a random caption), which can only teach prompt-blind changes
Each arm evaluates (ODE, fixed per-image noise) at step 0 and every ``--eval_every`` steps. CPU-seconds = the
process's CPU time in training from the step-0 eval on, evaluation excluded (``time.process_time`` around each eval;
the reward threads count). Per eval it reports, from `deepgen_rl.toy.run_report.run_statistics` over the held-out
prompts: strict accuracy, own (an image's claim score on its own prompt), other (the same images on 8 other held-out
prompts: what a prompt-blind image scores) and own - other (what only prompt following raises), each with a
one-sided exact sign test over prompts of the last eval against step 0 (at level α its false-positive rate is ≤ α).
Prints one table per metric (value @ CPU-s per eval, gain per 100 CPU-s, the sign test) and writes a PNG. Alias arms
(gdpo, and window or full) run once and are reported under both names.

  python bench/toy_sample_efficiency.py                      # all arms, the prompt-following setting
  python bench/toy_sample_efficiency.py --arms cps,grpo      # a subset (two processes with disjoint --arms use 2 cores)
  python bench/toy_sample_efficiency.py --setting fast       # toy-v3, 40 steps per arm
  python bench/toy_sample_efficiency.py --smoke              # 2 arms x 2 steps of 32 images (tests/toy)
  python bench/toy_sample_efficiency.py --model_dir DIR --flags '{"learning_rate": 1e-4}'
                                                             # a model built elsewhere, other flags for every arm
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

from deepgen_rl.toy.rl_run import PROMPT_FOLLOWING_FLAGS  # noqa: E402  (no torch import: setup_env comes first)

_PF_REWARD = PROMPT_FOLLOWING_FLAGS["reward_kwargs"]["toy_compositional"]
# Each setting's arms: trainer flags over the setting's own (the base arm "cps" adds none); ALIASES name the same run.
ARMS = {
    "prompt_following": {
        "cps": {},
        "flowgrpo": dict(atrain_sde_sampler="flowgrpo_sde"),
        "dance": dict(atrain_sde_sampler="dance_sde", sde_eta=0.3),
        "grpo": dict(atrain_adv_type="grpo"),
        "full": dict(sde_window_size=0, reuse_last_velocity=False),
        "blind": dict(reward_kwargs={"toy_compositional": {**_PF_REWARD, "blind": True}}),
    },
    "fast": {
        "cps": dict(atrain_sde_sampler="cps_sde", sde_eta=0.7),
        "flowgrpo": dict(atrain_sde_sampler="flowgrpo_sde", sde_eta=0.7),
        "dance": dict(atrain_sde_sampler="dance_sde", sde_eta=0.3),
        "grpo": dict(atrain_sde_sampler="cps_sde", sde_eta=0.7, atrain_adv_type="grpo"),
        "window": dict(atrain_sde_sampler="cps_sde", sde_eta=0.7, sde_window_size=3),
        "blind": dict(atrain_sde_sampler="cps_sde", sde_eta=0.7,
                      reward_kwargs={"toy_compositional": {"exclusive": True, "blind": True}}),
    },
}
ALIASES = {"prompt_following": {"gdpo": "cps", "window": "cps"}, "fast": {"gdpo": "cps", "full": "cps"}}
DEFAULT_ARMS = "cps,flowgrpo,dance,gdpo,grpo,window,full,blind"
STEPS = {"prompt_following": (20, 10), "fast": (40, 10)}  # (steps, eval_every)
SMOKE_FLAGS = {  # --smoke: 2 steps of 4 prompts x 8 images, the 128-image held-out eval of eval_toy.yaml
    "prompt_following": dict(rollout_global_batch_size=32, rollout_micro_batch_size=32, atrain_micro_batch_size=32),
    "fast": dict(rollout_micro_batch_size=16, atrain_micro_batch_size=16, rollout_n=4, num_inference_steps=6),
}
METRICS = (("strict", "held-out strict accuracy"), ("own", "held-out claim score, own prompt"),
           ("other", "held-out claim score, 8 other prompts"), ("own_minus_other", "held-out own - other"))


def setting_run(setting: str, smoke: bool, workdir: Path) -> dict:
    """The setting's ``run_toy_rl`` keywords (flags, data, eval; the prompt-following setting's SFT-anchor pairs are
    written into ``workdir``) and its model variant."""
    from deepgen_rl.toy import rl_run

    if setting == "fast":
        return dict(variant="default", kwargs=dict(dataset_config=rl_run.TOY_RL_YAML,
                                                   eval_config=rl_run.TOY_EVAL_YAML))
    kwargs = rl_run.prompt_following_kwargs(workdir, sftaux_pairs=256 if smoke else 4096)
    if smoke:
        kwargs["eval_config"] = rl_run.TOY_EVAL_YAML
    return dict(variant=rl_run.PROMPT_FOLLOWING_VARIANT, kwargs=kwargs)


def run_arm(name: str, flags: dict, steps: int, eval_every: int, workdir: Path, model_dir: str,
            run_kwargs: dict) -> list[dict]:
    """``run_statistics`` rows (one per eval: step, strict / own / other / own - other as mean over held-out prompts
    with a sign test against step 0) of one arm, each with ``cpu_s``: training CPU-seconds before that eval."""
    import deepgen_rl.trainer.eval_hook as eval_hook
    from deepgen_rl.models import build_model
    from deepgen_rl.toy.model import model_dir_overrides
    from deepgen_rl.toy.rl_run import TOY_MODEL_CONFIG, run_toy_rl
    from deepgen_rl.toy.run_report import run_statistics

    original = eval_hook.run_training_eval
    marks: dict[int, float] = {}
    eval_cpu = [0.0]
    start = time.process_time()

    def timed_eval(*args, **kwargs):
        step = inspect.signature(original).bind(*args, **kwargs).arguments["step"]
        t0 = time.process_time()
        marks[step] = t0 - start - eval_cpu[0]
        try:
            return original(*args, **kwargs)
        finally:
            eval_cpu[0] += time.process_time() - t0

    eval_hook.run_training_eval = timed_eval
    try:
        model = build_model(TOY_MODEL_CONFIG, **model_dir_overrides(model_dir))
        start = time.process_time()
        res = run_toy_rl(workdir / name, steps=steps, eval_every=eval_every, model=model,
                         **{**run_kwargs, **flags, "eval_at_start": True})
    finally:
        eval_hook.run_training_eval = original
    rows = run_statistics(res.output_dir)
    zero = marks[rows[0]["step"]]  # CPU-s are counted from the step-0 eval: imports and trainer set-up left out
    return [dict(r, cpu_s=marks[r["step"]] - zero) for r in rows]


def plot(curves: dict[str, list[dict]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(METRICS), figsize=(5.5 * len(METRICS), 4))
    for ax, (key, label) in zip(axes, METRICS):
        for name, rows in curves.items():
            ax.plot([r["cpu_s"] for r in rows], [r[key]["mean"] for r in rows], marker="o", label=name)
        ax.set_xlabel("training CPU-seconds (eval excluded)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def print_tables(curves: dict[str, list[dict]]) -> None:
    names = list(curves)
    evals = [r["step"] for r in curves[names[0]]]
    for key, label in METRICS:
        rows = []
        for n, pts in curves.items():
            first, last = pts[0], pts[-1]
            gain = (last[key]["mean"] - first[key]["mean"]) / max(last["cpu_s"], 1e-9) * 100
            sign = f"{last[key]['up']}/{last[key]['down']}, p {last[key]['p']:.2g}"
            rows.append([n] + [f"{r[key]['mean']:.3f} @ {r['cpu_s']:.0f}s" for r in pts] + [f"{gain:+.3f}", sign])
        print_table(f"{label} @ training CPU-seconds", ["arm"] + [f"step {s}" for s in evals]
                    + ["gain / 100 CPU-s", f"up/down vs step 0, p (step {evals[-1]})"], rows)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--setting", choices=sorted(ARMS), default="prompt_following")
    p.add_argument("--arms", default=DEFAULT_ARMS, help="comma-separated (default: %(default)s)")
    p.add_argument("--steps", type=int, default=None, help="steps per arm (prompt_following 20, fast 40)")
    p.add_argument("--eval_every", type=int, default=None, help="eval cadence in steps (default 10)")
    p.add_argument("--png", default=str(ROOT / "outputs" / "toy_sample_efficiency.png"))
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--smoke", action="store_true", help="2 arms x 2 steps, small batches and eval")
    p.add_argument("--model_dir", default=None,
                   help="a toy model built elsewhere (python -m deepgen_rl.toy.model --variant NAME --out DIR) "
                        "instead of the setting's cached variant (built on first use)")
    p.add_argument("--flags", default="{}",
                   help="JSON object of trainer flags over the setting's for every arm (an arm's own flags win), "
                        "e.g. '{\"learning_rate\": 1e-4}'")
    a = p.parse_args(argv)
    try:
        extra = json.loads(a.flags)
    except ValueError as e:
        p.error(f"--flags is not JSON: {e}")
    if not isinstance(extra, dict):
        p.error(f"--flags must be a JSON object of trainer flags, got {a.flags!r}")
    arms, aliases = ARMS[a.setting], ALIASES[a.setting]
    names = ["cps", "flowgrpo"] if a.smoke else list(dict.fromkeys(n.strip() for n in a.arms.split(",") if n.strip()))
    unknown = [n for n in names if n not in arms and n not in aliases]
    if unknown or not names:
        p.error(f"--arms: unknown {unknown}; choose from {sorted({*arms, *aliases})}")
    steps, every = (2, 2) if a.smoke else (STEPS[a.setting][0] if a.steps is None else a.steps,
                                           STEPS[a.setting][1] if a.eval_every is None else a.eval_every)
    if steps < 1 or every < 1:
        p.error(f"--steps and --eval_every must be >= 1, got {steps} and {every}")
    setup_env(a.threads)  # before torch-heavy imports (deepgen_rl.toy.model imports torch)
    from deepgen_rl.toy.model import ensure_toy_deepgen, model_dir_overrides

    if a.model_dir:
        try:
            model_dir_overrides(a.model_dir)
        except (FileNotFoundError, ValueError) as e:
            p.error(f"--model_dir: {e}")
    print(load_note())
    workdir = Path(tempfile.mkdtemp(prefix="toy_bench_"))
    curves: dict[str, list[dict]] = {}
    try:
        run = setting_run(a.setting, a.smoke, workdir)
        model_dir = a.model_dir or ensure_toy_deepgen(progress=True, variant=run["variant"])["root"]
        flags = {**(SMOKE_FLAGS[a.setting] if a.smoke else {}), **extra}
        for name in names:
            key = aliases.get(name, name)
            if key not in curves:
                print(f"[bench] arm {key}: {steps} steps, eval every {every}", flush=True)
                curves[key] = run_arm(key, {**flags, **arms[key]}, steps, every, workdir, model_dir, run["kwargs"])
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    curves = {n: curves[aliases.get(n, n)] for n in names}
    print(f"setting {a.setting}, model {model_dir}")
    print_tables(curves)
    png = Path(a.png)
    png.parent.mkdir(parents=True, exist_ok=True)
    plot(curves, png)
    print(f"wrote {png}")
    print(load_note())
    print_rerun(__file__, threads=a.threads)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
