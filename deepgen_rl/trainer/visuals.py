"""Sample grids (PNG in the output dir, and to wandb/swanlab when they are active)."""

from __future__ import annotations

import json
import logging
import textwrap
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

log = logging.getLogger(__name__)


def make_grid(images: list[Image.Image], captions: list[str], *, columns: int = 8, thumb: int = 128) -> Image.Image:
    """Images in a grid, each with a short caption below it."""
    n = len(images)
    columns = max(1, min(columns, n))
    rows = (n + columns - 1) // columns
    cap_h = 44
    font = ImageFont.load_default(size=10)
    grid = Image.new("RGB", (columns * thumb, rows * (thumb + cap_h)), "white")
    draw = ImageDraw.Draw(grid)
    for i, (im, cap) in enumerate(zip(images, captions)):
        r, c = divmod(i, columns)
        x, y = c * thumb, r * (thumb + cap_h)
        grid.paste(im.convert("RGB").resize((thumb, thumb)), (x, y))
        lines = textwrap.wrap(cap, width=max(8, thumb // 6))[:3]
        draw.multiline_text((x + 2, y + thumb + 1), "\n".join(lines), fill="black", font=font, spacing=1)
    return grid


def save_sample_grid(images, prompts, rewards, path: Path, *, report_to=(), step: int = 0, max_images: int = 32):
    images, prompts, rewards = images[:max_images], prompts[:max_images], rewards[:max_images]
    captions = [f"{r:.3f} | {p}" if r == r else f"n/a | {p}" for p, r in zip(prompts, rewards)]
    grid = make_grid(images, captions)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".part.png")
    grid.save(tmp)
    tmp.replace(path)
    report_to = list(report_to or [])
    if "wandb" in report_to:
        try:
            import wandb

            if wandb.run is not None:
                wandb.log({"samples": wandb.Image(grid, caption=f"step {step}")}, step=step)
        except Exception as e:  # logging images must never stop training, but say so
            log.warning("could not log the sample grid to wandb: %s", e)
    if "swanlab" in report_to:
        from deepgen_rl.trainer.loggers import active_swanlab_run

        try:
            import swanlab

            if active_swanlab_run() is not None:
                swanlab.log({"samples": swanlab.Image(grid, caption=f"step {step}")}, step=step)
        except Exception as e:
            log.warning("could not log the sample grid to swanlab: %s", e)
    return path


def read_metrics(output_dir: Path) -> list[dict]:
    path = output_dir / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: did the training run write any step?")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def plot_reward_curve(metrics: list[dict], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [m.get("step", i + 1) for i, m in enumerate(metrics)]
    # panel 1: the weighted total per dataset (datasets weight different rewards, so their totals differ in scale
    # and a mixed per-step total jumps with the prompt mix); then one panel per reward component
    datasets = sorted({k for m in metrics for k in m if k.startswith("reward_by_dataset/")})
    rewards = sorted(k for k in metrics[0] if k.startswith("reward/") and k != "reward/total")
    panels = [("weighted total by dataset", datasets or ["reward/total"])] + [(k, [k]) for k in rewards]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4), squeeze=False)
    for ax, (title, keys) in zip(axes[0], panels):
        for key in keys:
            pts = [(s, m[key]) for s, m in zip(steps, metrics) if key in m and m[key] == m[key]]
            if not pts:
                continue
            xs, ys = zip(*pts)
            k = max(1, len(ys) // 8)
            smooth = [sum(ys[max(0, i - k + 1): i + 1]) / len(ys[max(0, i - k + 1): i + 1]) for i in range(len(ys))]
            label = key.split("/", 1)[1]
            line, = ax.plot(xs, ys, marker=".", lw=0.8, alpha=0.6, label=f"{label} (per step)")
            ax.plot(xs, smooth, lw=2, color=line.get_color(), label=f"{label} (mean of last {k})")
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def step_time_html(last: dict) -> str:
    """One report paragraph: the last step's time and its rollout / reward-wait / update parts (``time/*`` metrics)."""
    def t(key):
        return f"{last.get(key, float('nan')):.2f}"

    return (f"<p>Step time (last step): {t('time/step_s')} s;\nrollout {t('time/rollout_s')} s, reward wait "
            f"{t('time/reward_wait_s')} s,\nupdate {t('time/update_s')} s.</p>")
