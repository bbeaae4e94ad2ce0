"""Static HTML page of one eval step: per dataset a summary table (accuracies as percentages; the JSON holds
fractions), the judge protocol and whether the numbers are leaderboard-comparable, then one card per prompt with its
images (relative paths), the prompt, its test points and each image's verdicts. All text is html-escaped."""

from __future__ import annotations

from collections import defaultdict
from html import escape
from pathlib import Path
from typing import Any, Mapping, Sequence

from deepgen_rl.evaluation.config import EvalPrompt

_CSS = """
body{font-family:sans-serif;margin:16px;background:#fafafa}table{border-collapse:collapse;margin:6px 0}
td,th{border:1px solid #ccc;padding:2px 6px;font-size:13px;vertical-align:top}.card{background:#fff;border:1px solid
#ddd;margin:10px 0;padding:8px}.imgs img{width:192px;height:192px;object-fit:contain;margin-right:4px}
.ok{color:#080}.bad{color:#b00}.na{color:#888}.prompt{margin:4px 0 6px 0}
"""


_ACC_KEYS = ("overall", "primary_mean_acc", "testpoint_micro_acc", "success_rate")
_COUNT_KEYS = ("num_images", "num_judged", "num_failed", "num_malformed_answers", "num_missing_images",
               "num_malformed_rows")


def _pct(v: Any) -> str:
    return "–" if v is None else f"{100 * v:.2f}%"


def _fmt(v: Any) -> str:
    return "–" if v is None else (f"{v:.4f}" if isinstance(v, float) else str(v))


def _protocol_block(s: Mapping[str, Any]) -> str:
    p = s.get("protocol") or {}
    template = (p.get("template") or {}).get("kind", "?")
    if s.get("leaderboard_comparable"):
        verdict = "<p class='ok'>Official protocol: comparable with the leaderboard (see caveat).</p>"
    else:
        why = "".join(f"<li>{escape(r)}</li>" for r in s.get("not_comparable_because", ()))
        verdict = f"<p class='bad'>Not leaderboard-comparable:</p><ul>{why}</ul>"
    sizes = ", ".join(f"{d['width']}×{d['height']} ({d['num_images']})" for d in s.get("image_size") or ())
    rows = [("template", template), ("judge model", p.get("model")), ("decoding", p.get("decoding")),
            ("answer re-requests", p.get("answer_retries")), ("image encoding", p.get("image_encoding")),
            ("image size (w×h)", sizes or None)]
    table = "".join(f"<tr><th>{escape(k)}</th><td>{escape(_fmt(v))}</td></tr>" for k, v in rows if v is not None)
    caveat = f"<p class='na'>{escape(p['judge_caveat'])}</p>" if p.get("judge_caveat") else ""
    return verdict + f"<table>{table}</table>" + caveat


def _summary_table(s: Mapping[str, Any]) -> str:
    rows = "".join(f"<tr><th>{escape(k)}</th><td>{escape(_pct(s.get(k)))}</td></tr>" for k in _ACC_KEYS if k in s)
    if s.get("overall_missing_primaries"):
        rows += (f"<tr><th>overall missing</th><td>{escape(', '.join(s['overall_missing_primaries']))}</td></tr>")
    rows += "".join(f"<tr><th>{escape(k)}</th><td>{escape(_fmt(s.get(k)))}</td></tr>" for k in _COUNT_KEYS if k in s)
    dims = "".join(
        f"<tr><td>{escape(level)}</td><td>{escape(name)}</td><td>{escape(_pct(r['acc']))}</td>"
        f"<td>{r['correct']}/{r['total']}</td></tr>"
        for level in ("primary", "sub") for name, r in s.get(level, {}).items())
    out = (_protocol_block(s) if "protocol" in s else "") + f"<table>{rows}</table>"
    if dims:
        out += f"<details open><summary>dimensions</summary><table><tr><th>level</th><th>dimension</th>" \
               f"<th>accuracy</th><th>correct/total</th></tr>{dims}</table></details>"
    bad = s.get("malformed_rows") or []
    if bad:
        items = "".join(f"<li>index {escape(str(m['index']))}: {escape(m['error'])}</li>" for m in bad)
        out += f"<p class='bad'>malformed prompt rows (not evaluated, not repaired):</p><ul>{items}</ul>"
    missing = s.get("missing_images") or []
    if missing:
        out += f"<p class='bad'>missing images (&lt;index&gt;_&lt;k&gt;): {escape(', '.join(missing[:200]))}</p>"
    return out


def _verdict_cell(j: Mapping[str, Any] | None, k: int) -> str:
    if j is None:
        return "<td class='na'>·</td>"
    if j["status"] != "ok":
        return f"<td class='bad' title='{escape(str(j.get('error')), quote=True)}'>{escape(j['status'])}</td>"
    v = j["verdicts"][k]
    return f"<td class='{'ok' if v else 'bad'}'>{'✓ 1' if v else '✗ 0'}</td>"


def _prompt_card(item: EvalPrompt | None, index: int, images: list[Mapping[str, Any]],
                 jmap: Mapping[tuple, Mapping[str, Any]]) -> str:
    images = sorted(images, key=lambda r: r["dup"])
    prompt = item.prompt if item else images[0].get("prompt", "")
    imgs = "".join(f"<a href='{escape(r['rel_path'], quote=True)}'><img loading='lazy' "
                   f"src='{escape(r['rel_path'], quote=True)}' alt='{index}.{r['dup']}'></a>" for r in images)
    js = [jmap.get((r["dataset"], r["index"], r["dup"])) for r in images]
    head = "".join(f"<th>#{r['dup']}</th>" for r in images)
    rows = ""
    for k, tp in enumerate(item.testpoints if item else ()):
        cells = "".join(_verdict_cell(j, k) for j in js)
        rows += f"<tr><td>{escape(tp.name)}</td><td>{escape(tp.description)}</td>{cells}</tr>"
    table = f"<table><tr><th>test point</th><th>description</th>{head}</tr>{rows}</table>" if rows else ""
    return (f"<div class='card'><b>#{index}</b><div class='prompt'>{escape(prompt)}</div>"
            f"<div class='imgs'>{imgs}</div>{table}</div>")


def write_html_report(path: str | Path, summaries: Mapping[str, Mapping[str, Any]],
                      prompts_by_dataset: Mapping[str, Sequence[EvalPrompt]], records: Sequence[Mapping[str, Any]],
                      judgments: Sequence[Mapping[str, Any]], *, title: str = "UniGenBench eval") -> None:
    """``records``: dicts with dataset/index/dup/rel_path (paths relative to the page); ``judgments``: dicts of
    :class:`~deepgen_rl.evaluation.unigenbench.Judgment`."""
    jmap = {(j["dataset"], j["index"], j["dup"]): j for j in judgments}
    by_ds: dict[str, dict[int, list]] = defaultdict(lambda: defaultdict(list))
    for r in records:
        by_ds[r["dataset"]][r["index"]].append(r)
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{escape(title)}</title>"
             f"<style>{_CSS}</style></head><body><h1>{escape(title)}</h1>"]
    for ds in list(summaries) + [d for d in by_ds if d not in summaries]:
        parts.append(f"<h2 id='{escape(ds, quote=True)}'>{escape(ds)}</h2>")
        if ds in summaries:
            parts.append(_summary_table(summaries[ds]))
        items = {p.index: p for p in prompts_by_dataset.get(ds, ())}
        for index in sorted(by_ds.get(ds, {})):
            parts.append(_prompt_card(items.get(index), index, by_ds[ds][index], jmap))
    parts.append("</body></html>")
    Path(path).write_text("\n".join(parts), encoding="utf-8")
