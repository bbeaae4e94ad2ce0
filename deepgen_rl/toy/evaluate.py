"""Toy-world evaluation: sample images for toy prompts, check them, and summarise.

Metrics of a set of checked images (each image i has claims c with pass bits p_ic):
  strict_acc            mean over images of [all claims of i pass]           (GenEval's headline number)
  claim_score           mean over images of (fraction of i's claims that pass) (= the mean toy_compositional reward)
  claim_acc/<type>      passed / total over all claims of that type (color, shape, count, position)
  strict_acc/<kind>     strict accuracy of the images whose caption is of that kind (single, count, region, relation)

Used by the eval runner (``scoring: toy`` in an eval YAML), the RL proof tests, the quickstart and the benchmark.
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch

from .checker import CLAIM_TYPES, CheckResult, check, check_blobs, find_blobs
from .world import KINDS, parse_caption

SUMMARY_FILE = "toy_summary.json"
VERDICTS_FILE = "toy_verdicts.jsonl"
HTML_FILE = "toy.html"
# the held-out eval dataset of assets/rl_datasets/toy/eval/eval_toy.yaml (and tests/toy/eval_toy_heldout.yaml)
HELDOUT = "toy_heldout"


@dataclass
class ToyVerdict:
    prompt: str
    kind: str
    result: CheckResult

    def to_dict(self) -> dict[str, Any]:
        return {"prompt": self.prompt, "kind": self.kind, "strict": self.result.strict, "score": self.result.score,
                "verdict": self.result.verdict(),
                "claims": [{"type": c.type, "text": c.text, "passed": c.passed} for c in self.result.claims]}


def check_images(images, prompts: Sequence[str]) -> list[ToyVerdict]:
    """One verdict per (image, prompt); prompts must be toy-grammar captions (`CaptionError` otherwise)."""
    out = []
    for img, p in zip(images, prompts, strict=True):
        spec = parse_caption(p)
        out.append(ToyVerdict(p, spec.kind, check(img, spec)))
    return out


def other_prompt_scores(images, prompts: Sequence[str], n_others: int = 8) -> list[float]:
    """Per image: the mean claim score of the image checked against ``n_others`` OTHER prompts of the set.

    The distinct prompts in order of first appearance, p_0 … p_{m-1}; an image of p_j is checked against p_{j+1} …
    p_{j+n} (indices mod m). An image that follows its own prompt scores higher on it than on these; a prompt-blind
    model (images independent of their prompts) scores the same on both in expectation over the set, because each
    prompt is an "other" prompt as often as an own one. So own − other, not own alone, measures prompt following,
    and a prompt-blind change of the model (e.g. "draw every colour") raises both."""
    distinct = list(dict.fromkeys(prompts))
    pos = {p: j for j, p in enumerate(distinct)}
    n = min(n_others, len(distinct) - 1)
    if n < 1:
        raise ValueError("other_prompt_scores needs at least two distinct prompts")
    specs = [parse_caption(p) for p in distinct]
    out = []
    for img, p in zip(images, prompts, strict=True):
        blobs = find_blobs(img)  # read once, checked against n specs
        out.append(sum(check_blobs(blobs, specs[(pos[p] + k) % len(distinct)]).score for k in range(1, n + 1)) / n)
    return out


def summarize(verdicts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Metrics (module docstring) of verdict dicts (`ToyVerdict.to_dict`); None where there is nothing to count."""
    n = len(verdicts)
    out: dict[str, Any] = {"num_images": n,
                           "strict_acc": sum(v["strict"] for v in verdicts) / n if n else None,
                           "claim_score": sum(v["score"] for v in verdicts) / n if n else None,
                           "claim_acc": {}, "strict_acc_by_kind": {}, "claims_by_type": {}}
    for t in CLAIM_TYPES:
        cs = [c["passed"] for v in verdicts for c in v["claims"] if c["type"] == t]
        out["claims_by_type"][t] = len(cs)
        out["claim_acc"][t] = sum(cs) / len(cs) if cs else None
    for k in KINDS:
        vs = [v["strict"] for v in verdicts if v["kind"] == k]
        out["strict_acc_by_kind"][k] = sum(vs) / len(vs) if vs else None
    return out


def summary_metrics(name: str, summary: dict[str, Any], prefix: str = "eval") -> dict[str, float]:
    """Flat ``eval/<name>/strict_acc``, ``…/claim_score``, ``…/claim_acc/<type>``, ``…/strict_acc/<kind>``."""
    base = f"{prefix}/{name}"
    out = {f"{base}/num_images": float(summary["num_images"])}
    for key in ("strict_acc", "claim_score"):
        if summary[key] is not None:
            out[f"{base}/{key}"] = float(summary[key])
    for t, v in summary["claim_acc"].items():
        if v is not None:
            out[f"{base}/claim_acc/{t}"] = float(v)
    for k, v in summary["strict_acc_by_kind"].items():
        if v is not None:
            out[f"{base}/strict_acc/{k}"] = float(v)
    return out


def write_toy_report(out_dir: str | Path, summaries: dict[str, dict[str, Any]],
                     verdicts: Sequence[dict[str, Any]], *, title: str = "Toy-world eval") -> Path:
    """``toy_summary.json``, ``toy_verdicts.jsonl`` and ``toy.html`` (summary tables + every image with its
    verdict; verdict dicts carry ``dataset`` and ``rel_path``) in ``out_dir``; returns the HTML path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / SUMMARY_FILE).write_text(json.dumps(summaries, indent=2), encoding="utf-8")
    with (out_dir / VERDICTS_FILE).open("w", encoding="utf-8") as f:
        for v in verdicts:
            f.write(json.dumps(v) + "\n")
    parts = [f"<h1>{html.escape(title)}</h1>"]
    for ds, s in summaries.items():
        rows = [("strict accuracy", s["strict_acc"]), ("mean claim score", s["claim_score"])]
        rows += [(f"claim accuracy: {t} ({s['claims_by_type'][t]} claims)", v) for t, v in s["claim_acc"].items()]
        rows += [(f"strict accuracy: {k} prompts", v) for k, v in s["strict_acc_by_kind"].items()]
        table = "".join(f"<tr><td>{html.escape(k)}</td><td>{'—' if v is None else f'{v:.3f}'}</td></tr>"
                        for k, v in rows)
        cards = "".join(
            f'<figure class="{"pass" if v["strict"] else "fail"}"><img src="{html.escape(v["rel_path"])}" '
            f'width="128"><figcaption>{html.escape(v["prompt"])}<br><b>{html.escape(v["verdict"])}</b>'
            f'</figcaption></figure>' for v in verdicts if v.get("dataset") == ds and v.get("rel_path"))
        parts.append(f"<h2>{html.escape(ds)} ({s['num_images']} images)</h2><table>{table}</table>"
                     f"<div>{cards}</div>")
    page = ("<!doctype html><html><head><meta charset='utf-8'><title>toy eval</title><style>"
            "body{font-family:sans-serif} td{border:1px solid #ccc;padding:3px 8px} table{border-collapse:collapse}"
            "figure{display:inline-block;width:150px;margin:4px;font-size:11px;vertical-align:top}"
            "figure.pass{border:3px solid #3a3} figure.fail{border:3px solid #c33}"
            "</style></head><body>" + "".join(parts) + "</body></html>")
    path = out_dir / HTML_FILE
    path.write_text(page, encoding="utf-8")
    return path


def score_eval_records(step_dir: str | Path, records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Check eval images written by ``generate_eval_images`` (record dicts with dataset/index/dup/prompt/rel_path);
    returns verdict dicts carrying those keys too."""
    from PIL import Image

    out = []
    for r in records:
        with Image.open(Path(step_dir) / r["rel_path"]) as im:
            v = check_images([im.convert("RGB")], [r["prompt"]])[0]
        out.append({**{k: r[k] for k in ("dataset", "index", "dup", "rel_path")}, **v.to_dict()})
    return out
