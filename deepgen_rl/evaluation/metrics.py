"""UniGenBench accuracies, logging metric names and the files of one eval step.

All accuracies are fractions in [0, 1] (the HTML page shows percentages). Over images whose judgment is ``ok``:

- ``primary[<name>]`` / ``sub[<name>]``: pooled ratios, (image × test point) pairs judged 1 / pairs judged, per
  dimension (a test point that occurs twice in a prompt counts twice), as the official ``calculate_scores``;
- ``overall``: the unweighted mean of the 10 primary-dimension accuracies (the leaderboard's "Overall"), only when
  all 10 primary dimensions of the language have judged test points; otherwise None and
  ``overall_missing_primaries`` names the missing ones;
- ``primary_mean_acc``: the mean over the primary dimensions present (equals ``overall`` when all 10 are);
- ``testpoint_micro_acc``: pairs judged 1 / pairs judged over the whole dataset (micro average; NOT the leaderboard
  number).

Failed and malformed judgments are excluded and counted (``num_failed`` = ``num_request_failed`` +
``num_malformed_answers``); ``success_rate`` = judged / images. The same names are logged during training as
``eval/<dataset>/<name>`` (:func:`summary_to_metrics`).

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


# the 10 primary dimensions of UniGenBench, per language (the leaderboard's Overall is their mean)
PRIMARY_DIMENSIONS = {
    "en": ("Style", "World Knowledge", "Attribute", "Action", "Relationship", "Compound", "Grammar", "Entity Layout",
           "Logical Reasoning", "Text Generation"),
    "zh": ("风格", "世界知识", "属性", "动作", "关系", "复合考点", "语法", "实体布局", "逻辑推理", "文本生成"),
}
HEADLINE_KEYS = ("overall", "primary_mean_acc", "testpoint_micro_acc")


def _acc(correct: int, total: int) -> float | None:
    return correct / total if total else None


def _expected_primaries(language: str | None, present: Iterable[str]) -> tuple[str, ...]:
    if language in PRIMARY_DIMENSIONS:
        return PRIMARY_DIMENSIONS[language]
    present = set(present)
    return max(PRIMARY_DIMENSIONS.values(), key=lambda names: len(present & set(names)))


def comparability(protocol: Mapping[str, Any] | None, overall: float | None) -> tuple[bool, list[str]]:
    """(leaderboard_comparable, reasons it is not). Only the official template can be comparable."""
    protocol = protocol or {}
    reasons = []
    if (protocol.get("template") or {}).get("kind") != "official":
        reasons.append("project judge template (run with --official_repo / $UNIGENBENCH_OFFICIAL_REPO for the "
                       "official one)")
    if protocol.get("sampling_overridden"):
        reasons.append("sampling parameters set by the user (the official client leaves them unset)")
    if overall is None:
        reasons.append("overall missing: not all 10 primary dimensions were judged")
    return not reasons, reasons


def compute_unigenbench_summary(dataset: str, prompts: Sequence[EvalPrompt], judgments: Iterable,
                                *, language: str | None = None, malformed_rows: Sequence[MalformedRow] = (),
                                protocol: Mapping[str, Any] | None = None,
                                image_size: Any = None) -> dict[str, Any]:
    """Summary dict of one dataset. ``judgments``: :class:`~deepgen_rl.evaluation.unigenbench.Judgment` (or dicts),
    one per image of ``prompts``. ``protocol``: the judge's description (template, sampling, retries; see
    :func:`deepgen_rl.evaluation.unigenbench.protocol_info`); ``image_size``: the evaluation resolution(s)."""
    by_index = {p.index: p for p in prompts}
    primary: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    sub: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    counts = {"ok": 0, "failed": 0, "malformed": 0, "skipped": 0}
    failures, attempts = [], 0
    for j in judgments:
        j = j if isinstance(j, Mapping) else j.to_dict()
        counts[j["status"]] = counts.get(j["status"], 0) + 1
        attempts += int(j.get("attempts") or 0)
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
    expected = _expected_primaries(language, primary_accs)
    missing = [k for k in expected if primary_accs.get(k) is None]
    overall = None if missing else sum(primary_accs[k] for k in expected) / len(expected)
    comparable, reasons = comparability(protocol, overall)

    def table(d):
        return {k: {"correct": c, "total": t, "acc": _acc(c, t)} for k, (c, t) in sorted(d.items())}

    return {
        "dataset": dataset,
        "language": language,
        "leaderboard_comparable": comparable,
        "not_comparable_because": reasons,
        "overall": overall,
        "overall_missing_primaries": missing,
        "primary_mean_acc": sum(primary_accs.values()) / len(primary_accs) if primary_accs else None,
        "testpoint_micro_acc": _acc(correct, total),
        "num_prompts": len(prompts),
        "num_images": num_images,
        "num_judged": counts["ok"],
        "num_failed": counts["failed"] + counts["malformed"],
        "num_request_failed": counts["failed"],
        "num_malformed_answers": counts["malformed"],
        "num_skipped": counts["skipped"],
        "num_judge_requests": attempts,
        "success_rate": counts["ok"] / num_images if num_images else 0.0,
        "num_testpoints_judged": total,
        "num_testpoints_correct": correct,
        "primary": table(primary),
        "unknown_primaries": sorted(set(primary) - set(expected)),
        "sub": table(sub),
        "image_size": image_size,
        "protocol": dict(protocol or {}),
        "num_malformed_rows": len(malformed_rows),
        "malformed_rows_handling": "reported and excluded, never repaired",
        "malformed_rows": [m.to_dict() for m in malformed_rows],
        "failures": failures,
    }


def is_judged_summary(s: Mapping[str, Any]) -> bool:
    """True for a UniGenBench-judged summary (as opposed to a generate-only dataset)."""
    return "testpoint_micro_acc" in s


def summary_to_metrics(summaries: Mapping[str, Mapping[str, Any]], prefix: str = "eval") -> dict[str, float]:
    """Flat ``{"eval/<dataset>/overall": …, "eval/<dataset>/primary/<Name>": …}`` for wandb/swanlab: the summary's
    own names. Accuracies that are None (no judged test point; ``overall`` without all 10 primaries) are left out
    (not logged as 0)."""
    out: dict[str, float] = {}
    for ds, s in summaries.items():
        base = f"{prefix}/{sanitize_metric_name(ds)}"
        out[f"{base}/num_images"] = float(s.get("num_images", 0))
        if not is_judged_summary(s):  # dataset without scoring
            continue
        for key in ("success_rate", "num_judged", "num_failed", "num_malformed_rows"):
            out[f"{base}/{key}"] = float(s[key])
        for key in HEADLINE_KEYS:
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
            if not is_judged_summary(s):
                continue
            for key in ("overall", "primary_mean_acc"):
                w.writerow([ds, "overall", key, "", "", "" if s[key] is None else f"{s[key]:.6f}"])
            w.writerow([ds, "overall", "testpoint_micro_acc", s["num_testpoints_correct"], s["num_testpoints_judged"],
                        "" if s["testpoint_micro_acc"] is None else f"{s['testpoint_micro_acc']:.6f}"])
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
