"""Quickstart report for a toy-world run (docs/toy_world.md): does RL teach the model to follow prompts?

``python -m deepgen_rl.toy.quickstart --output_dir outputs/quickstart`` reads the run's ``metrics.jsonl`` and its
evaluations (``eval/step_N/toy_summary.json``, ``toy_verdicts.jsonl`` and the eval images, written by the trainer's
``eval_freq`` hook with ``--eval_at_start true``), and writes next to them:

  samples_before_after.png  held-out prompts, first eval (top row) vs last eval (bottom row), same noise, each image
                            captioned with its checker verdict
  samples_changed.png       the same for held-out eval images whose verdict changed (up to 6 FAIL->PASS, then up to 6
                            PASS->FAIL; selected by outcome, labelled so); absent when none changed
  accuracy_curve.png        strict accuracy per eval dataset and held-out claim accuracy per claim type, per step
  reward_curve.png          the training reward(s) per step
  report.html               all of it, plus the before/after table of strict, per-claim-type and per-kind accuracy,
                            and the held-out claim score against the images' own prompts vs against other prompts
                            (the part a prompt-blind change, e.g. "draw every colour", would also raise), with
                            per-prompt sign tests (`deepgen_rl.toy.run_report`; from the run's report.json if
                            it has the same eval steps)
"""

from __future__ import annotations

import argparse
import html
import json
from pathlib import Path

from deepgen_rl.checkpoints.rl_format import latest_checkpoint
from deepgen_rl.toy.evaluate import HELDOUT  # the eval dataset shown in the report
from deepgen_rl.trainer.visuals import make_grid, plot_reward_curve, read_metrics, step_time_html


def toy_eval_curves(output_dir: Path) -> tuple[dict[int, dict], dict[int, list[dict]]]:
    """Toy summaries and per-image verdicts of every eval step of the run (``eval/step_N/toy_*``)."""
    from deepgen_rl.toy.rl_run import read_evals

    evals, verdicts = read_evals(output_dir)
    if not evals:
        raise FileNotFoundError(f"no eval/step_*/toy_summary.json in {output_dir}: run training with "
                                f"--eval_dataset_config assets/rl_datasets/toy/eval/eval_toy.yaml --eval_at_start true")
    return evals, verdicts


def plot_accuracy_curve(evals: dict[int, dict], path: Path) -> Path:
    """Strict accuracy per eval dataset, and held-out claim accuracy per claim type, against the training step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = sorted(evals)
    datasets = sorted({d for e in evals.values() for d in e})
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    for ds in datasets:
        pts = [(s, evals[s][ds]["strict_acc"]) for s in steps if ds in evals[s]]
        axes[0].plot(*zip(*pts), marker="o", label=ds)
    axes[0].set_title("strict accuracy (all claims pass)")
    heldout = HELDOUT if HELDOUT in datasets else datasets[0]
    for t in evals[steps[0]][heldout]["claim_acc"]:
        pts = [(s, evals[s][heldout]["claim_acc"][t]) for s in steps if evals[s][heldout]["claim_acc"][t] is not None]
        if pts:
            axes[1].plot(*zip(*pts), marker=".", label=t)
    axes[1].set_title(f"{heldout}: claim accuracy by type")
    for ax in axes:
        ax.set_xlabel("step")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _grid_of(output_dir: Path, steps: tuple[int, int], tables: tuple[dict, dict], shown: list, path: Path) -> Path:
    """The images of ``shown`` (keys of both tables) at the two eval steps, the first step's row above the
    second's, each captioned with its prompt and checker verdict."""
    from PIL import Image

    images, captions = [], []
    for step, table in zip(steps, tables):
        for k in shown:
            v = table[k]
            with Image.open(output_dir / "eval" / f"step_{step}" / v["rel_path"]) as im:
                images.append(im.convert("RGB"))
            failed = sorted({c["type"] for c in v["claims"] if not c["passed"]})
            captions.append(f"{v['prompt']} | step {step}: " + ("PASS" if not failed else "FAIL " + ",".join(failed)))
    grid = make_grid(images, captions, columns=len(shown), thumb=160)
    path.parent.mkdir(parents=True, exist_ok=True)
    grid.save(path)
    return path


def before_after_grid(output_dir: Path, verdicts: dict[int, list[dict]], path: Path, *, dataset: str = "",
                      num_prompts: int = 12, changed_path: Path | None = None, num_changed: int = 6
                      ) -> tuple[Path, dict[str, int], list[tuple[str, str]] | None]:
    """The first ``num_prompts`` held-out prompts (image 0 of each, the same noise before and after; not selected by
    outcome): the first eval step's image above the last one's, each captioned with its checker verdict. Returns
    (path, counts of fail->pass / pass->fail / unchanged over ALL eval images of the dataset, changed), where, with
    ``changed_path``, ``changed`` lists the images shown in a second grid there: the first ``num_changed`` (in eval
    order) that went from FAIL to PASS, then the first ``num_changed`` that went from PASS to FAIL, as (key, change);
    None when no image changed its verdict (no second grid is written)."""
    first, last = min(verdicts), max(verdicts)
    dataset = dataset or HELDOUT
    key = lambda v: (v["index"], v["dup"])  # noqa: E731
    before = {key(v): v for v in verdicts[first] if v["dataset"] == dataset}
    after = {key(v): v for v in verdicts[last] if v["dataset"] == dataset}
    shown = [k for k in sorted(before) if k[1] == 0][:num_prompts]
    _grid_of(output_dir, (first, last), (before, after), shown, path)
    changes = {"fail->pass": 0, "pass->fail": 0, "unchanged": 0}
    flipped: dict[str, list] = {"fail->pass": [], "pass->fail": []}
    for k, v in sorted(before.items()):
        a = after[k]["strict"]
        change = "fail->pass" if a and not v["strict"] else "pass->fail" if v["strict"] and not a else "unchanged"
        changes[change] += 1
        if change != "unchanged":
            flipped[change].append(k)
    changed = None
    if changed_path is not None and (flipped["fail->pass"] or flipped["pass->fail"]):
        picked = [(k, c) for c in ("fail->pass", "pass->fail") for k in flipped[c][:num_changed]]
        _grid_of(output_dir, (first, last), (before, after), [k for k, _ in picked], changed_path)
        changed = [(f"prompt {k[0]}, image {k[1]}", c) for k, c in picked]
    return path, changes, changed


def claim_table(evals: dict[int, dict]) -> list[tuple[str, str, float | None, float | None]]:
    """(dataset, metric, first eval, last eval) rows: strict accuracy, claim score, per-claim-type, per-kind."""
    first, last = evals[min(evals)], evals[max(evals)]
    rows = []
    for ds in sorted(first):
        a, b = first[ds], last.get(ds, first[ds])
        rows += [(ds, "strict_acc", a["strict_acc"], b["strict_acc"]), (ds, "claim_score", a["claim_score"],
                                                                          b["claim_score"])]
        rows += [(ds, f"claim_acc/{t}", a["claim_acc"][t], b["claim_acc"][t]) for t in a["claim_acc"]]
        rows += [(ds, f"strict_acc/{k}", a["strict_acc_by_kind"][k], b["strict_acc_by_kind"][k])
                 for k in a["strict_acc_by_kind"]]
    return rows


PROMPT_ROWS = (("own", "own prompts"), ("other", "other prompts"), ("own_minus_other", "own minus other prompts"))


def own_vs_other(output_dir: Path, evals: dict[int, dict]) -> tuple[dict, dict]:
    """The first and last eval's held-out statistics (`deepgen_rl.toy.run_report.run_statistics`: per prompt, the
    claim score against its own prompt, against 8 other held-out prompts and their difference; means over prompts,
    the last with a sign test against the first). Read from the ``report.json`` that scripts/toy_prompt_following.sh
    writes with them when it covers the same eval steps, else computed."""
    from deepgen_rl.toy.run_report import run_statistics

    path = output_dir / "report.json"
    rows = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else []
    if not rows or (rows[0]["step"], rows[-1]["step"]) != (min(evals), max(evals)):
        rows = run_statistics(output_dir, HELDOUT)
    return rows[0], rows[-1]


def _prompt_row(prompt_stats: tuple[dict, dict], key: str, label: str) -> str:
    a, b = prompt_stats[0][key], prompt_stats[1][key]
    return (f"<tr><td>{label}</td><td>{a['mean']:.3f}</td><td>{b['mean']:.3f}</td><td>{b['mean'] - a['mean']:+.3f}"
            f"</td><td>{b['up']} / {b['down']}, p {b['p']:.2g}</td></tr>")


def _fmt(x) -> str:
    return "—" if x is None else f"{x:.3f}"


def _trained_exclusive(checkpoint: Path | None) -> bool:
    """Whether the run's reward was ``toy_compositional`` with ``exclusive=true`` (its checkpoint's training args)."""
    args_file = Path(checkpoint, "training_args.json") if checkpoint else None
    if args_file is None or not args_file.is_file():
        return False
    kwargs = json.loads(json.loads(args_file.read_text()).get("reward_kwargs") or "{}")  # a JSON string flag
    return bool(kwargs.get("toy_compositional", {}).get("exclusive"))


def write_report(output_dir: Path, metrics: list[dict], evals: dict[int, dict], changes: dict[str, int],
                 checkpoint: Path | None, prompt_stats: tuple[dict, dict],
                 changed: list[tuple[str, str]] | None = None) -> Path:
    last = metrics[-1]
    if changed:
        up = sum(c == "fail->pass" for _, c in changed)
        changed_html = (f"<h3>Images whose verdict changed</h3><p>Selected by outcome, so not a sample: the first "
                        f"{up} held-out eval images (in eval order) that went from FAIL to PASS, left, then the first "
                        f"{len(changed) - up} that went from PASS to FAIL, right; step {min(evals)} above, step "
                        f"{max(evals)} below.</p><img src=\"samples_changed.png\" alt=\"changed verdicts\">")
    else:
        changed_html = "<p>No held-out eval image changed its verdict.</p>"
    first_step, last_step = min(evals), max(evals)
    rows = "".join(f"<tr><td>{html.escape(ds)}</td><td>{html.escape(m)}</td><td>{_fmt(a)}</td><td>{_fmt(b)}</td></tr>"
                   for ds, m, a, b in claim_table(evals))
    toy_pages = "".join(
        f'<li><a href="eval/step_{s}/toy.html">step {s}</a></li>' for s in sorted(evals))
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>DeepGen-RL quickstart</title>
<style>body{{font-family:sans-serif;max-width:1100px;margin:2em auto}} table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 10px}} img{{max-width:100%}}</style></head><body>
<h1>DeepGen-RL quickstart: does RL teach prompt following in the toy world?</h1>
<p>{len(metrics)} MR-GRPO steps on the pre-trained toy DeepGen (CPU), reward <code>toy_compositional</code> (the
fraction of the prompt's claims — colour, shape, count, position — that a programmatic checker finds in the image{
"; trained with <code>exclusive=true</code>: one more claim, no colour the prompt does not name, which evaluation "
"does not score" if _trained_exclusive(checkpoint) else ""}).
Evaluation: held-out compositions (colour–shape pairs never seen in pre-training; the eval prompts are never trained
on), ODE sampling with the same noise at every eval step. Checkpoint:
<code>{html.escape(str(checkpoint) if checkpoint else "none")}</code>.</p>
<h2>Before / after (step {first_step} above, step {last_step} below; same noise)</h2>
<p>Each image is captioned with its checker verdict (PASS, or the claims that fail). Over all
{sum(changes.values())} held-out eval images: {changes["fail->pass"]} went from FAIL to PASS,
{changes["pass->fail"]} from PASS to FAIL, {changes["unchanged"]} kept their verdict.</p>
<img src="samples_before_after.png" alt="before/after">
{changed_html}
<h2>Held-out accuracy during training</h2><img src="accuracy_curve.png" alt="accuracy curve">
<h2>Accuracy before and after (eval step {first_step} vs {last_step})</h2>
<table><tr><th>dataset</th><th>metric</th><th>before</th><th>after</th></tr>{rows}</table>
<h2>Own prompt or any prompt?</h2>
<p>The held-out images' claim score checked against their own prompts and against 8 other held-out prompts, as the
mean over prompts. A prompt-blind change (drawing every colour, bigger blobs) raises both alike; only prompt following
raises own minus other. The last column is a one-sided exact sign test over the prompts whose value changed (at
level α its false-positive rate is at most α).</p>
<table><tr><th>checked against</th><th>step {first_step}</th><th>step {last_step}</th><th>change</th>
<th>prompts up / down, p</th></tr>{"".join(_prompt_row(prompt_stats, k, label) for k, label in PROMPT_ROWS)}
</table>
<h2>Reward curves</h2><img src="reward_curve.png" alt="reward curve">
<h2>Every eval image with its verdict</h2><ul>{toy_pages}</ul>
{step_time_html(last)}
</body></html>"""
    path = output_dir / "report.html"
    path.write_text(page, encoding="utf-8")
    return path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--output_dir", required=True)
    p.add_argument("--num_prompts", type=int, default=12, help="held-out prompts shown in the before/after grid")
    a = p.parse_args(argv)
    out = Path(a.output_dir)
    metrics = read_metrics(out)
    curve = plot_reward_curve(metrics, out / "reward_curve.png")
    evals, verdicts = toy_eval_curves(out)
    acc = plot_accuracy_curve(evals, out / "accuracy_curve.png")
    grid, changes, changed = before_after_grid(out, verdicts, out / "samples_before_after.png",
                                               num_prompts=a.num_prompts, changed_path=out / "samples_changed.png")
    ckpt = latest_checkpoint(out)
    prompt_stats = own_vs_other(out, evals)
    report = write_report(out, metrics, evals, changes, ckpt, prompt_stats, changed)
    print(f"held-out and train-split accuracy, eval step {min(evals)} -> {max(evals)}:")
    for ds, m, before, after in claim_table(evals):
        print(f"  {ds:14s} {m:22s} {_fmt(before)} -> {_fmt(after)}")
    print(f"  held-out images: {changes}")
    for k, label in PROMPT_ROWS:
        a, b = prompt_stats[0][k], prompt_stats[1][k]
        print(f"  held-out claim score against {label}: {a['mean']:.3f} -> {b['mean']:.3f} "
              f"({b['mean'] - a['mean']:+.3f}; {b['up']} prompts up / {b['down']} down, p {b['p']:.2g})")
    k = max(1, min(5, len(metrics) // 2))
    for key in sorted({kk for m in metrics for kk in m if kk.startswith("reward/")} - {"reward/total"}):
        first = [m[key] for m in metrics[:k] if key in m and m[key] == m[key]]
        last = [m[key] for m in metrics[-k:] if key in m and m[key] == m[key]]
        if first and last:
            print(f"  {key}: mean of first {k} steps {sum(first) / len(first):.4f} -> last {k} "
                  f"{sum(last) / len(last):.4f}")
    for path in (curve, acc, grid, out / "samples_changed.png" if changed else None, report, ckpt):
        if path is None:
            continue
        print(f"  {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
