"""UniGenBench accuracies, logging metric names and the files of one eval step.

Accuracy = (test points judged 1) / (test points judged), over images whose judgment is ``ok`` only:
``overall_acc`` over all judged test points (micro), ``primary_mean_acc`` the mean of the primary-dimension
accuracies (macro), ``primary[<name>]`` / ``sub[<name>]`` per dimension. Failed and malformed judgments are excluded
and counted (``num_failed`` = ``num_request_failed`` + ``num_malformed_answers``); ``success_rate`` = judged / images.

Files written to an eval step directory: ``unigenbench_summary.json`` ({dataset: summary}),
``unigenbench_dimensions.csv`` (one row per dataset × level × dimension), ``judgments.jsonl`` (one verdict per image)
and ``index.html`` (see :mod:`deepgen_rl.evaluation.report`).
"""

from __future__ import annotations

import csv
import json
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from deepgen_rl.evaluation.config import EvalPrompt, MalformedRow

SUMMARY_FILE = "unigenbench_summary.json"
DIMENSIONS_FILE = "unigenbench_dimensions.csv"
JUDGMENTS_FILE = "judgments.jsonl"
HTML_FILE = "index.html"


def sanitize_metric_name(name: str) -> str:
    """Make a dimension name safe as ONE metric-name segment: no ``/`` (loggers group on it), trimmed."""
    return " ".join(name.replace("/", "_").replace("\\", "_").split())


def _acc(correct: int, total: int) -> float | None:
    return correct / total if total else None


def compute_unigenbench_summary(dataset: str, prompts: Sequence[EvalPrompt], judgments: Iterable,
                                *, language: str | None = None,
                                malformed_rows: Sequence[MalformedRow] = ()) -> dict[str, Any]:
    """Summary dict of one dataset. ``judgments``: :class:`~deepgen_rl.evaluation.unigenbench.Judgment` (or dicts),
    one per generated image of ``prompts``."""
    by_index = {p.index: p for p in prompts}
    primary: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    sub: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    counts = {"ok": 0, "failed": 0, "malformed": 0, "skipped": 0}
    failures = []
    for j in judgments:
        j = j if isinstance(j, Mapping) else j.to_dict()
        counts[j["status"]] = counts.get(j["status"], 0) + 1
        if j["status"] != "ok":
            failures.append({"image": j["rel_path"], "status": j["status"], "error": j.get("error")})
            continue
        item = by_index[j["index"]]
        for tp, v in zip(item.testpoints, j["verdicts"]):
            for table, key in ((primary, tp.primary), (sub, tp.sub)):
                table[key][0] += int(v)
                table[key][1] += 1
    num_images = sum(counts.values())
    correct = sum(c for c, _ in primary.values())
    total = sum(t for _, t in primary.values())
    primary_accs = {k: _acc(c, t) for k, (c, t) in primary.items()}

    def table(d):
        return {k: {"correct": c, "total": t, "acc": _acc(c, t)} for k, (c, t) in sorted(d.items())}

    return {
        "dataset": dataset,
        "language": language,
        "num_prompts": len(prompts),
        "num_images": num_images,
        "num_judged": counts["ok"],
        "num_failed": counts["failed"] + counts["malformed"],
        "num_request_failed": counts["failed"],
        "num_malformed_answers": counts["malformed"],
        "num_skipped": counts["skipped"],
        "success_rate": counts["ok"] / num_images if num_images else 0.0,
        "num_testpoints_judged": total,
        "num_testpoints_correct": correct,
        "overall_acc": _acc(correct, total),
        "primary_mean_acc": sum(primary_accs.values()) / len(primary_accs) if primary_accs else None,
        "primary": table(primary),
        "sub": table(sub),
        "num_malformed_rows": len(malformed_rows),
        "malformed_rows": [m.to_dict() for m in malformed_rows],
        "failures": failures,
    }


def summary_to_metrics(summaries: Mapping[str, Mapping[str, Any]], prefix: str = "eval") -> dict[str, float]:
    """Flat ``{"eval/<dataset>/overall_acc": …, "eval/<dataset>/primary/<Name>": …}`` for wandb/swanlab.
    Accuracies without any judged test point are left out (not logged as 0)."""
    out: dict[str, float] = {}
    for ds, s in summaries.items():
        base = f"{prefix}/{sanitize_metric_name(ds)}"
        out[f"{base}/num_images"] = float(s.get("num_images", 0))
        if "overall_acc" not in s:  # dataset without scoring
            continue
        for key in ("success_rate", "num_judged", "num_failed", "num_malformed_rows"):
            out[f"{base}/{key}"] = float(s[key])
        for key in ("overall_acc", "primary_mean_acc"):
            if s[key] is not None:
                out[f"{base}/{key}"] = float(s[key])
        for level in ("primary", "sub"):
            for name, row in s[level].items():
                if row["acc"] is not None:
                    out[f"{base}/{level}/{sanitize_metric_name(name)}"] = float(row["acc"])
    return out


def write_dimensions_csv(path: str | Path, summaries: Mapping[str, Mapping[str, Any]]) -> None:
    with Path(path).open("w", encoding="utf-8", newline="") as f:
        w = csv.writer(f)
        w.writerow(["dataset", "level", "dimension", "correct", "total", "acc"])
        for ds, s in summaries.items():
            if "overall_acc" not in s:
                continue
            w.writerow([ds, "overall", "overall", s["num_testpoints_correct"], s["num_testpoints_judged"],
                        "" if s["overall_acc"] is None else f"{s['overall_acc']:.6f}"])
            for level in ("primary", "sub"):
                for name, row in s[level].items():
                    w.writerow([ds, level, name, row["correct"], row["total"],
                                "" if row["acc"] is None else f"{row['acc']:.6f}"])


def write_eval_reports(out_dir: str | Path, summaries: Mapping[str, Mapping[str, Any]],
                       prompts_by_dataset: Mapping[str, Sequence[EvalPrompt]], judgments: Sequence,
                       records: Sequence | None = None, *, title: str = "UniGenBench eval") -> Path:
    """Write summary JSON, dimension CSV, judgments.jsonl and index.html into ``out_dir``; returns ``out_dir``.

    ``records`` (image records with dataset/index/dup/rel_path) list every image for the HTML page; without them
    the judged images are shown."""
    from deepgen_rl.evaluation.report import write_html_report

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    jdicts = [j if isinstance(j, Mapping) else j.to_dict() for j in judgments]
    (out_dir / SUMMARY_FILE).write_text(json.dumps(summaries, ensure_ascii=False, indent=2), encoding="utf-8")
    write_dimensions_csv(out_dir / DIMENSIONS_FILE, summaries)
    with (out_dir / JUDGMENTS_FILE).open("w", encoding="utf-8") as f:
        for j in jdicts:
            f.write(json.dumps(j, ensure_ascii=False) + "\n")
    rdicts = jdicts if records is None else [r if isinstance(r, Mapping) else r.to_dict() for r in records]
    write_html_report(out_dir / HTML_FILE, summaries, prompts_by_dataset, rdicts, jdicts, title=title)
    return out_dir
