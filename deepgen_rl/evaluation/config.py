"""Eval dataset YAML and prompt files (UniGenBench CSV, ``.txt``, ``.jsonl``).

Eval YAML format (paths are relative to the YAML file)::

    datasets:
      - name: unigenbench_en
        path: unigenbench/test_prompts_en.csv
        cfg_scale: 4.0
        num_inference_steps: 50
        duplicates: 4            # images per prompt
        scoring: unigenbench/en  # unigenbench/en | unigenbench/zh | none
        height: 512              # optional evaluation resolution (default: the training resolution)
        width: 512

UniGenBench prompt files are not shipped with this repository: download ``test_prompts_{en,en_long,zh,zh_long}.csv``
from the UniGenBench repository (https://github.com/CodeGoat24/UniGenBench, folder ``data/``) or its Hugging Face
dataset (``CodeGoat24/UniGenBench``) and place them in ``unigenbench/`` next to the eval YAML
(``assets/rl_datasets/deepgen/eval/unigenbench/``), or point ``path`` at wherever they live.

UniGenBench CSV layout: ``index,prompt,sub_dims`` (this project's and DeepGen-RL's copies) or the official headers
``index,prompt_en,sub_dims_en`` / ``index,prompt_zh,sub_dims_zh``; ``sub_dims`` is a JSON object. English files use
the keys ``Testpoints`` / ``Testpoint Description`` (parallel lists), Chinese files ``考点`` / ``考点对应描述``. A test
point is named ``"<Primary> - <Sub>"`` in English (``"Attribute - Quantity"``) and ``"<主>-<次>"`` in Chinese
(``"属性-数量"``); a few have no sub part (``"Style"``, ``"风格"``), in which case primary and sub dimension are the same
name. Rows whose ``sub_dims`` is not valid JSON (or whose lists disagree) are returned as :class:`MalformedRow` and
logged; they are neither generated nor judged, and every report lists them. They are never repaired: the one known
case, row 509 of the official ``test_prompts_en_long.csv`` (a missing comma), is reported as malformed (the official
code cannot run that file at all).

Optional per-dataset ``height`` / ``width`` (pixels, both or neither, multiples of 16) set the evaluation resolution;
without them the trainer's ``--image_height/--image_width`` apply. Reports record the resolution used.
"""

from __future__ import annotations

import csv
import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

logger = logging.getLogger(__name__)

SCORING_CHOICES = ("unigenbench/en", "unigenbench/zh", "toy", "none")  # toy: deepgen_rl.toy.checker, no judge

# (test points key, descriptions key) per language
_TESTPOINT_KEYS = {"en": ("Testpoints", "Testpoint Description"), "zh": ("考点", "考点对应描述")}
# accepted (prompt column, sub_dims column) pairs: ours, then the official per-language headers
CSV_COLUMNS = {None: ("prompt", "sub_dims"), "en": ("prompt_en", "sub_dims_en"), "zh": ("prompt_zh", "sub_dims_zh")}
_DIM_SEPARATOR = re.compile(r"\s*-\s*")


@dataclass(frozen=True)
class EvalTestPoint:
    """One UniGenBench test point: ``name`` is the full test point name, e.g. ``"Attribute - Quantity"``."""

    name: str
    description: str
    primary: str
    sub: str


@dataclass(frozen=True)
class EvalPrompt:
    """One prompt of an eval dataset. ``index`` is the CSV ``index`` (line number for .txt/.jsonl)."""

    index: int
    prompt: str
    testpoints: tuple[EvalTestPoint, ...] = ()
    meta: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class MalformedRow:
    """A prompt-file row that could not be parsed (kept out of generation/judging, but reported)."""

    index: str
    error: str

    def to_dict(self) -> dict[str, str]:
        return {"index": self.index, "error": self.error}


@dataclass
class EvalDatasetSpec:
    name: str
    path: Path
    prompts: list[EvalPrompt]
    cfg_scale: float = 4.0
    num_inference_steps: int = 50
    duplicates: int = 4
    scoring: str | None = None  # "unigenbench/en" | "unigenbench/zh" | None
    malformed_rows: list[MalformedRow] = field(default_factory=list)
    height: int | None = None  # evaluation resolution; None = the caller's (training) resolution
    width: int | None = None

    @property
    def language(self) -> str | None:
        """``"en"``/``"zh"`` for UniGenBench scoring, else None."""
        return scoring_language(self.scoring)


def scoring_language(scoring: str | None) -> str | None:
    """``"unigenbench/en"`` -> ``"en"``; other scoring kinds and None -> None."""
    return scoring.split("/", 1)[1] if scoring and scoring.startswith("unigenbench/") else None


def split_dimension(testpoint: str) -> tuple[str, str]:
    """``"Attribute - Quantity"`` -> ``("Attribute", "Attribute - Quantity")``; ``"Style"`` -> ``("Style", "Style")``.

    The primary dimension is the part before the first hyphen; the sub dimension is the full test point name (sub
    names such as "State" are only unique together with their primary).
    """
    name = testpoint.strip()
    parts = _DIM_SEPARATOR.split(name, maxsplit=1)
    return parts[0], name


def parse_unigenbench_row(row: dict[str, str], columns: tuple[str, str] = CSV_COLUMNS[None]) -> EvalPrompt:
    """Parse one CSV row (``index`` and the ``columns`` = (prompt, sub_dims) pair); raises ValueError on anything
    malformed."""
    prompt_col, dims_col = columns
    try:
        index = int(str(row.get("index", "")).strip())
    except ValueError as exc:
        raise ValueError(f"bad index {row.get('index')!r}") from exc
    prompt = (row.get(prompt_col) or "").strip()
    if not prompt:
        raise ValueError("empty prompt")
    try:
        sub_dims = json.loads(row.get(dims_col) or "")
    except json.JSONDecodeError as exc:
        raise ValueError(f"{dims_col} is not valid JSON: {exc}") from exc
    if not isinstance(sub_dims, dict):
        raise ValueError(f"{dims_col} is not a JSON object")
    for lang, (tp_key, desc_key) in _TESTPOINT_KEYS.items():
        if tp_key in sub_dims:
            break
    else:
        expected = [k for k, _ in _TESTPOINT_KEYS.values()]
        raise ValueError(f"{dims_col} has no test point key (expected one of {expected})")
    names, descs = sub_dims.get(tp_key), sub_dims.get(desc_key)
    if not isinstance(names, list) or not isinstance(descs, list) or not names:
        raise ValueError(f"{tp_key!r}/{desc_key!r} must be non-empty lists")
    if len(names) != len(descs):
        raise ValueError(f"{len(names)} test points but {len(descs)} descriptions")
    points = []
    for name, desc in zip(names, descs):
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"bad test point name {name!r}")
        primary, sub = split_dimension(name)
        points.append(EvalTestPoint(name=name.strip(), description=str(desc), primary=primary, sub=sub))
    meta = {k: v for k, v in sub_dims.items() if k not in (tp_key, desc_key)}
    meta["language"] = lang
    return EvalPrompt(index=index, prompt=prompt, testpoints=tuple(points), meta=meta)


def _csv_columns(path: Path, fieldnames: list[str], language: str | None) -> tuple[str, str]:
    present = [lang for lang, cols in CSV_COLUMNS.items() if set(cols) <= set(fieldnames)]
    if "index" not in fieldnames or not present:
        expected = " or ".join("index," + ",".join(c) for c in CSV_COLUMNS.values())
        raise ValueError(f"{path}: CSV header {fieldnames} has none of the accepted column sets ({expected})")
    if language is not None and language in present:
        return CSV_COLUMNS[language]
    if None in present:
        return CSV_COLUMNS[None]
    if len(present) == 1 and language is None:
        return CSV_COLUMNS[present[0]]
    raise ValueError(f"{path}: language {language!r} was requested but the CSV has the columns of {present}")


def load_unigenbench_csv(path: str | Path, language: str | None = None) -> tuple[list[EvalPrompt], list[MalformedRow]]:
    """Read a UniGenBench CSV (either header style). Returns (prompts, malformed rows); malformed rows are logged with
    index and error. With ``language`` ("en"/"zh"), test points in the other language's JSON keys are an error (the
    wrong file for the judge's language), not malformed rows."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"UniGenBench CSV not found: {path} (see deepgen_rl/evaluation/config.py for where "
                                "to download it)")
    prompts, malformed = [], []
    seen: set[int] = set()
    with path.open(encoding="utf-8-sig", newline="") as f:
        reader = csv.DictReader(f)
        columns = _csv_columns(path, list(reader.fieldnames or ()), language)
        for row in reader:
            try:
                item = parse_unigenbench_row(row, columns)
                if item.index in seen:
                    raise ValueError("duplicate index")
            except ValueError as exc:
                bad = MalformedRow(index=str(row.get("index")), error=str(exc))
                logger.warning("%s: malformed row index=%s: %s", path.name, bad.index, bad.error)
                malformed.append(bad)
                continue
            seen.add(item.index)
            prompts.append(item)
    langs = {p.meta["language"] for p in prompts}
    if language is not None and langs - {language}:
        raise ValueError(f"{path}: its test points use the {sorted(langs)} keys "
                         f"({[_TESTPOINT_KEYS[k][0] for k in sorted(langs)]}) but language {language!r} was "
                         f"requested (scoring: unigenbench/{language} / --language {language})")
    return prompts, malformed


def load_prompt_file(path: str | Path, language: str | None = None) -> tuple[list[EvalPrompt], list[MalformedRow]]:
    """Load ``.csv`` (UniGenBench, in ``language`` when given), ``.txt`` (one prompt a line, blank lines skipped) or
    ``.jsonl`` (``prompt`` or ``caption``). For .txt/.jsonl the index is the 0-based position among kept prompts."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"eval prompt file not found: {path}")
    suffix = path.suffix.lower()
    if suffix == ".csv":
        return load_unigenbench_csv(path, language)
    prompts: list[EvalPrompt] = []
    malformed: list[MalformedRow] = []
    with path.open(encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            line = line.strip()
            if not line:
                continue
            if suffix == ".txt":
                text = line
            elif suffix == ".jsonl":
                try:
                    obj = json.loads(line)
                    text = obj.get("prompt", obj.get("caption")) if isinstance(obj, dict) else None
                    if not isinstance(text, str) or not text.strip():
                        raise ValueError("no 'prompt' or 'caption' string")
                except ValueError as exc:
                    bad = MalformedRow(index=f"line {line_no}", error=str(exc))
                    logger.warning("%s: malformed row %s: %s", path.name, bad.index, bad.error)
                    malformed.append(bad)
                    continue
                text = text.strip()
            else:
                raise ValueError(f"unsupported prompt file type {suffix!r}: {path} (use .csv, .txt or .jsonl)")
            prompts.append(EvalPrompt(index=len(prompts), prompt=text))
    return prompts, malformed


def _parse_scoring(value: Any, name: str) -> str | None:
    if value is None or str(value).strip().lower() in ("", "none", "null", "false"):
        return None
    value = str(value).strip().lower()
    if value not in SCORING_CHOICES:
        raise ValueError(f"eval dataset {name!r}: scoring must be one of {SCORING_CHOICES}, got {value!r}")
    return value


def _parse_size(entry: dict, name: str, path: Path) -> tuple[int | None, int | None]:
    """Optional ``height``/``width`` of a dataset entry: both or neither, positive multiples of 16."""
    h, w = entry.get("height"), entry.get("width")
    if h is None and w is None:
        return None, None
    try:
        h, w = int(h), int(w)
    except (TypeError, ValueError):
        raise ValueError(f"{path}: dataset {name!r}: height and width must both be set to integers, got "
                         f"height={entry.get('height')!r} width={entry.get('width')!r}") from None
    if h <= 0 or w <= 0 or h % 16 or w % 16:
        raise ValueError(f"{path}: dataset {name!r}: height/width must be positive multiples of 16, got {h}x{w}")
    return h, w


def load_eval_config(path: str | Path) -> list[EvalDatasetSpec]:
    """Parse an eval YAML into specs with their prompts loaded. Raises FileNotFoundError naming a missing file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"eval config not found: {path}")
    with path.open(encoding="utf-8") as f:
        cfg = yaml.safe_load(f) or {}
    entries = cfg.get("datasets")
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"{path}: expected a non-empty 'datasets' list")
    specs, names = [], set()
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or "name" not in entry or "path" not in entry:
            raise ValueError(f"{path}: datasets[{i}] needs 'name' and 'path'")
        name = str(entry["name"])
        if "/" in name or name in names:
            raise ValueError(f"{path}: dataset name {name!r} is duplicated or contains '/'")
        names.add(name)
        prompt_path = (path.parent / str(entry["path"])).resolve()
        if not prompt_path.is_file():
            raise FileNotFoundError(f"{path}: dataset {name!r}: prompt file not found: {prompt_path}")
        scoring = _parse_scoring(entry.get("scoring"), name)
        if scoring and scoring.startswith("unigenbench/") and prompt_path.suffix.lower() != ".csv":
            raise ValueError(f"{path}: dataset {name!r}: {scoring} scoring needs a UniGenBench .csv")
        prompts, malformed = load_prompt_file(prompt_path, scoring_language(scoring))
        height, width = _parse_size(entry, name, path)
        spec = EvalDatasetSpec(
            name=name,
            path=prompt_path,
            prompts=prompts,
            cfg_scale=float(entry.get("cfg_scale", 4.0)),
            num_inference_steps=int(entry.get("num_inference_steps", 50)),
            duplicates=int(entry.get("duplicates", 4)),
            scoring=scoring,
            malformed_rows=malformed,
            height=height,
            width=width,
        )
        if spec.duplicates < 1 or spec.num_inference_steps < 1:
            raise ValueError(f"{path}: dataset {name!r}: duplicates and num_inference_steps must be >= 1")
        specs.append(spec)
    return specs
