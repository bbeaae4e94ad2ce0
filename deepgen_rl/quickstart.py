"""Quickstart report: reward curve, before/after samples and an HTML page for a finished run.

``python -m deepgen_rl.quickstart --output_dir outputs/quickstart_tiny --model_config configs/models/deepgen_tiny.py``
reads ``metrics.jsonl`` and the newest checkpoint of the run, and writes ``reward_curve.png``,
``samples_before_after.png`` and ``report.html`` next to them.
"""

from __future__ import annotations

import argparse
import html
import os
from pathlib import Path

import torch

from deepgen_rl.checkpoints.rl_format import latest_checkpoint
from deepgen_rl.trainer.visuals import make_grid, plot_reward_curve, read_metrics, step_time_html

DEFAULT_PROMPTS = ["A red apple on a wooden table", "A shop sign that says \"OPEN\"",
                   "A cat sleeping on a blue sofa", "A poster with the word \"HELLO\" in bold letters"]


@torch.no_grad()
def sample_images(model, prompts: list[str], *, steps: int, height: int, width: int, seed: int):
    """Deterministic ODE (Euler) samples, one per prompt, from the same noise for every model."""
    from deepgen_rl.evaluation.generate import sample_latents
    from deepgen_rl.utils.images import latents_to_pil
    from deepgen_rl.utils.seeding import make_generator

    shape = model.latent_shape(height, width)
    noise = torch.stack([torch.randn(shape, generator=make_generator("quickstart", seed, i))
                         for i in range(len(prompts))])
    x = sample_latents(model, model.encode_prompts(prompts), noise, cfg_scale=0.0, num_inference_steps=steps,
                       inference_mode="ode")
    return latents_to_pil(model.decode_latents(x))


def before_after_grid(model_config: str, checkpoint: Path, prompts: list[str], path: Path, *, steps: int,
                      height: int, width: int, seed: int) -> Path:
    from deepgen_rl.models import build_model

    before = sample_images(build_model(model_config), prompts, steps=steps, height=height, width=width, seed=seed)
    after = sample_images(build_model(model_config, checkpoint=str(checkpoint)), prompts, steps=steps,
                          height=height, width=width, seed=seed)
    captions = [f"before | {p}" for p in prompts] + [f"after | {p}" for p in prompts]
    grid = make_grid(before + after, captions, columns=len(prompts), thumb=160)
    path.parent.mkdir(parents=True, exist_ok=True)
    grid.save(path)
    return path


def write_report(output_dir: Path, metrics: list[dict], checkpoint: Path | None) -> Path:
    last = metrics[-1]
    k = max(1, min(5, len(metrics) // 2))

    def mean(ms, key):
        vals = [m[key] for m in ms if key in m and m[key] == m[key]]
        return sum(vals) / len(vals) if vals else float("nan")

    rows = "".join(
        f"<tr><td>{html.escape(key)}</td><td>{mean(metrics[:k], key):.4f}</td><td>{mean(metrics[-k:], key):.4f}</td></tr>"
        for key in sorted({kk for m in metrics for kk in m}) if key.startswith(("reward/", "reward_by_dataset/")))
    evals = sorted((output_dir / "eval").glob("step_*/index.html")) if (output_dir / "eval").is_dir() else []
    eval_links = "".join(f'<li><a href="{html.escape(os.path.relpath(p, output_dir))}">{html.escape(p.parent.name)}</a></li>'
                         for p in evals) or "<li>none</li>"
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>DeepGen-RL quickstart</title>
<style>body{{font-family:sans-serif;max-width:1100px;margin:2em auto}} table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 10px}} img{{max-width:100%}}</style></head><body>
<h1>DeepGen-RL quickstart</h1>
<p>{len(metrics)} MR-GRPO steps on the tiny DeepGen model (CPU). Checkpoint:
<code>{html.escape(str(checkpoint) if checkpoint else "none")}</code>.</p>
<h2>Rewards (mean of first {k} vs last {k} steps)</h2>
<p>reward/total mixes datasets that weight different rewards, so it moves with each step's prompt mix; the
per-dataset totals and the per-reward rows show the learning.</p>
<table><tr><th>metric</th><th>first</th><th>last</th></tr>{rows}</table>
<h2>Reward curve</h2><img src="reward_curve.png" alt="reward curve">
<h2>Samples before and after training (same noise)</h2><img src="samples_before_after.png" alt="samples">
<h2>Evaluation pages</h2><ul>{eval_links}</ul>
{step_time_html(last)}
</body></html>"""
    path = output_dir / "report.html"
    path.write_text(page, encoding="utf-8")
    return path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--output_dir", required=True)
    p.add_argument("--model_config", default="configs/models/deepgen_tiny.py")
    p.add_argument("--image_size", type=int, default=64)
    p.add_argument("--num_inference_steps", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    out = Path(a.output_dir)
    metrics = read_metrics(out)
    curve = plot_reward_curve(metrics, out / "reward_curve.png")
    ckpt = latest_checkpoint(out)
    if ckpt is None:
        raise FileNotFoundError(f"no complete checkpoint in {out}")
    grid = before_after_grid(a.model_config, ckpt, DEFAULT_PROMPTS, out / "samples_before_after.png",
                             steps=a.num_inference_steps, height=a.image_size, width=a.image_size, seed=a.seed)
    report = write_report(out, metrics, ckpt)
    k = max(1, min(5, len(metrics) // 2))
    # reward/total is left out: each step's total depends on which datasets its prompts came from (the datasets
    # weight different rewards), so compare per dataset and per reward instead
    print("reward means (per reward, and the weighted total per dataset):")
    for key in sorted({kk for m in metrics for kk in m if kk.startswith(("reward/", "reward_by_dataset/"))}
                      - {"reward/total"}):
        first = [m[key] for m in metrics[:k] if key in m and m[key] == m[key]]
        last = [m[key] for m in metrics[-k:] if key in m and m[key] == m[key]]
        if first and last:
            print(f"  {key}: mean of first {k} steps {sum(first) / len(first):.4f} -> last {k} {sum(last) / len(last):.4f}")
    for path in (curve, grid, report, ckpt):
        print(f"  {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
