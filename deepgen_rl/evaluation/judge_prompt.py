"""The UniGenBench judge's instruction (two templates) and how its answer is read.

Templates (:func:`load_judge_template`):

- ``project`` (default): this project's own wording. It asks for the same answer layout as the official one: an
  ``<analysis>`` list (one string per test point) and then a ``<score>`` list (one 0/1 per test point).
- ``official``: read from the user's clone of the official UniGenBench repository (``--official_repo`` /
  ``$UNIGENBENCH_OFFICIAL_REPO``). The module constants of ``eval/src/eval_common.py`` (the two instruction
  templates, the per-test-point definitions and ``LANG_CONFIGS``) are read with :mod:`ast`; the file is never
  imported or executed. The instruction is rendered as that file's ``build_system_prompt`` renders it::

      explanation      = f"{checkpoint_header}:「" + "".join(f"\\n{name}: {definition[name]}") + "\\n」"
      test_explanation = f"{checkpoint_desc_header}:「" + "".join(f"\\n{name_i}: {csv_description_i}") + "\\n」"
      template.format(prompt=prompt, testpoint=[names…], explanation=…, test_explanation=…)

  (``testpoint`` is the Python list of names, so it renders as ``['Style', 'World Knowledge']``; the template's own
  whitespace is kept). No official text is stored in this repository. A file whose layout differs from the one we
  know (UniGenBench commit :data:`SUPPORTED_OFFICIAL_COMMIT`) is refused with the reason.

Answer parsing (:func:`parse_answer`, the official rule): the FIRST ``<analysis>…</analysis>`` and the FIRST
``<score>…</score>`` (case-sensitive, may span lines); both bodies, stripped, must be Python literals
(``ast.literal_eval``) that are a list or tuple of length n = number of test points. A test point counts as met only
when its value ``== 1`` (``1``, ``1.0`` and ``True`` count; ``"1"`` does not). Anything else raises
:class:`MalformedAnswer`. Deviation, on purpose: the official code accepts any literal with a length (a string of n
characters) and crashes on a bare scalar score (``len(1)``); here both are malformed answers.
"""

from __future__ import annotations

import ast
import hashlib
import json
import logging
import re
import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from deepgen_rl.evaluation.config import EvalPrompt

OFFICIAL_REPO_ENV = "UNIGENBENCH_OFFICIAL_REPO"
OFFICIAL_FILE = "eval/src/eval_common.py"
# eval_common.py appeared in commit 9d5b7d8 (2026-02-13) and is unchanged up to this commit (2026-06-07)
SUPPORTED_OFFICIAL_COMMIT = "49d0bcebb0b9418d975d3957c2fee10f34811d14"
# sha256 of the template strings / definition dicts (json, sorted keys) at SUPPORTED_OFFICIAL_COMMIT: lets a summary
# say whether the user's clone holds exactly that text, without storing the text
SUPPORTED_OFFICIAL_SHA256 = {
    "SYSTEM_PROMPT_EN_TEMPLATE": "9554ee938feaaf928d9086ba959e19063bcb027be086821d7dcb45e55ad40f14",
    "SYSTEM_PROMPT_ZH_TEMPLATE": "03ccae681043f88291c14036b98ee99fbe34ac7659fe2186244afec075698926",
    "EXPLANATION_DICT_EN": "6dbddf2c906e172a3d13ba74febc381a3457cb5be11175bf9ffbc2421047438a",
    "EXPLANATION_DICT_ZH": "d3e63660b517f8bf758831ff44afd1bb15b41542e576eb9aa25208f0215a3bbd",
}
_PLACEHOLDERS = {"prompt", "testpoint", "explanation", "test_explanation"}
_LANG_KEYS = ("explanation_dict", "system_prompt_template", "checkpoint_header", "checkpoint_desc_header")
_BUILD_ARGS = ["prompt", "testpoint", "test_desc", "lang"]
_BUILD_PIECES = ("\n", ": ", "\n\u300d")  # string pieces build_system_prompt must contain (plus "<header>:「")

logger = logging.getLogger(__name__)
_ANALYSIS_TAG = re.compile(r"<analysis>(.*?)</analysis>", re.DOTALL)
_SCORE_TAG = re.compile(r"<score>(.*?)</score>", re.DOTALL)


class MalformedAnswer(ValueError):
    """The judge's answer does not hold valid ``<analysis>``/``<score>`` lists of the right length."""


class OfficialLayoutError(ValueError):
    """The official repository's ``eval_common.py`` is missing or laid out differently from the supported commit."""


def parse_answer(text: str | None, num_testpoints: int) -> list[int]:
    """Verdicts (0/1 ints, length ``num_testpoints``) from a judge answer, by the official rule (module docstring)."""
    if not text:
        raise MalformedAnswer("empty answer")
    found = {}
    for tag, pattern in (("analysis", _ANALYSIS_TAG), ("score", _SCORE_TAG)):
        m = pattern.search(text)
        if m is None:
            raise MalformedAnswer(f"no <{tag}>…</{tag}> in the answer")
        try:
            value = ast.literal_eval(m.group(1).strip())
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError) as exc:
            raise MalformedAnswer(f"<{tag}> is not a Python literal: {type(exc).__name__}: {exc}") from None
        if not isinstance(value, (list, tuple)):
            raise MalformedAnswer(f"<{tag}> holds a {type(value).__name__}, not a list")
        if len(value) != num_testpoints:
            raise MalformedAnswer(f"<{tag}> has {len(value)} items for {num_testpoints} test points")
        found[tag] = value
    return [1 if v == 1 else 0 for v in found["score"]]


# ---------------------------------------------------------------------------------------------------------------
# project template (our own wording)

_PROJECT_TEXT = {
    "en": (
        "You check a generated image against its text-to-image prompt. Judge only what is visible in the image; do "
        "not guess about anything that is unclear or hidden.\n\n"
        "Prompt: 「{prompt}」\n\n"
        "Check each of these {n} test points in order (name: what to look for):\n{testpoints}\n\n"
        "Answer in exactly this layout:\n"
        "<analysis>[{n} Python strings, one short analysis per test point, in order]</analysis>\n"
        "<score>[{n} integers, 1 if the image meets the test point and 0 if it does not, in order]</score>\n"
        "For example, for three test points: <analysis>['…', '…', '…']</analysis> <score>[1, 0, 1]</score>"
    ),
    "zh": (
        "请对照文生图提示词检查生成的图像。只依据图中可见的内容判断，不要猜测不清楚或被遮挡的部分。\n\n"
        "提示词：「{prompt}」\n\n"
        "请依次检查下面 {n} 个考点（名称：要看什么）：\n{testpoints}\n\n"
        "严格按以下格式回答：\n"
        "<analysis>[{n} 个 Python 字符串，按顺序每个考点一条简短分析]</analysis>\n"
        "<score>[{n} 个整数，按顺序，图像满足该考点记 1，否则记 0]</score>\n"
        "例如三个考点时：<analysis>['…', '…', '…']</analysis> <score>[1, 0, 1]</score>"
    ),
}
_PROJECT_LINE = {"en": "{i}. {name}: {description}", "zh": "{i}. {name}：{description}"}
LANGUAGES = tuple(_PROJECT_TEXT)


@dataclass(frozen=True)
class ProjectTemplate:
    kind: str = "project"

    def render(self, item: EvalPrompt, language: str) -> str:
        if language not in _PROJECT_TEXT:
            raise ValueError(f"language must be one of {list(LANGUAGES)}, got {language!r}")
        lines = "\n".join(_PROJECT_LINE[language].format(i=i, name=tp.name, description=tp.description)
                          for i, tp in enumerate(item.testpoints, start=1))
        return _PROJECT_TEXT[language].format(prompt=item.prompt, testpoints=lines, n=len(item.testpoints))

    def unknown_testpoints(self, prompts: Sequence[EvalPrompt], language: str) -> list[str]:
        return []

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "source": "deepgen_rl.evaluation.judge_prompt (this project's own wording)"}


# ---------------------------------------------------------------------------------------------------------------
# official template (read from the user's clone)

@dataclass(frozen=True)
class OfficialLanguage:
    template: str
    definitions: Mapping[str, str]
    checkpoint_header: str
    checkpoint_desc_header: str


@dataclass(frozen=True)
class OfficialTemplate:
    path: Path
    languages: Mapping[str, OfficialLanguage]
    sha256: Mapping[str, str] = field(default_factory=dict)
    repo_commit: str | None = None
    kind: str = "official"

    def render(self, item: EvalPrompt, language: str) -> str:
        """The instruction ``build_system_prompt(prompt, testpoint, test_desc, lang)`` of the official file returns."""
        cfg = self.languages.get(language)
        if cfg is None:
            raise ValueError(f"{self.path}: LANG_CONFIGS has no {language!r} (has {sorted(self.languages)})")
        names = [tp.name for tp in item.testpoints]
        missing = [n for n in names if n not in cfg.definitions]
        if missing:
            raise ValueError(f"test points {missing} of prompt {item.index} have no definition in {self.path}")
        explanation = f"{cfg.checkpoint_header}:\u300c" + "".join(f"\n{n}: {cfg.definitions[n]}" for n in names)
        test_explanation = f"{cfg.checkpoint_desc_header}:\u300c" + "".join(
            f"\n{tp.name}: {tp.description}" for tp in item.testpoints)
        return cfg.template.format(prompt=item.prompt, testpoint=names, explanation=explanation + "\n\u300d",
                                   test_explanation=test_explanation + "\n\u300d")

    def unknown_testpoints(self, prompts: Sequence[EvalPrompt], language: str) -> list[str]:
        """Test point names of ``prompts`` without a definition (the official code raises on them)."""
        cfg = self.languages.get(language)
        defs = cfg.definitions if cfg else {}
        return sorted({tp.name for p in prompts for tp in p.testpoints if tp.name not in defs})

    @property
    def matches_supported_commit(self) -> bool:
        return all(self.sha256.get(k) == v for k, v in SUPPORTED_OFFICIAL_SHA256.items())

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "source": str(self.path), "repo_commit": self.repo_commit,
                "supported_commit": SUPPORTED_OFFICIAL_COMMIT,
                "matches_supported_commit": self.matches_supported_commit, "sha256": dict(self.sha256)}


def _layout_error(path: Path, why: str) -> OfficialLayoutError:
    return OfficialLayoutError(
        f"{path}: {why}. The official template is read from the layout of UniGenBench commit "
        f"{SUPPORTED_OFFICIAL_COMMIT[:12]} (eval/src/eval_common.py: SYSTEM_PROMPT_EN/ZH_TEMPLATE, "
        f"EXPLANATION_DICT_EN/ZH, LANG_CONFIGS, build_system_prompt(prompt, testpoint, test_desc, lang)); check out "
        f"that commit (git -C <repo> checkout {SUPPORTED_OFFICIAL_COMMIT[:12]}) or run without --official_repo / "
        f"${OFFICIAL_REPO_ENV} to use the project template")


def _module_constants(tree: ast.Module, path: Path) -> dict[str, Any]:
    """Module-level ``NAME = <literal>`` assignments; ``LANG_CONFIGS`` may refer to earlier names."""
    consts: dict[str, Any] = {}
    for node in tree.body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
            continue
        name = node.targets[0].id
        if name == "LANG_CONFIGS":
            if not isinstance(node.value, ast.Dict):
                raise _layout_error(path, "LANG_CONFIGS is not a dict literal")
            langs = {}
            for k, v in zip(node.value.keys, node.value.values):
                if not (isinstance(k, ast.Constant) and isinstance(v, ast.Dict)):
                    raise _layout_error(path, "LANG_CONFIGS entries are not '<lang>': {…} dicts")
                entry = {}
                for kk, vv in zip(v.keys, v.values):
                    if not isinstance(kk, ast.Constant):
                        raise _layout_error(path, f"LANG_CONFIGS[{k.value!r}] has a non-constant key")
                    if isinstance(vv, ast.Name):
                        if vv.id not in consts:
                            raise _layout_error(path, f"LANG_CONFIGS[{k.value!r}] refers to unknown name {vv.id}")
                        entry[kk.value] = consts[vv.id]
                    else:
                        try:
                            entry[kk.value] = ast.literal_eval(vv)
                        except ValueError:
                            raise _layout_error(path, f"LANG_CONFIGS[{k.value!r}][{kk.value!r}] is not a "
                                                      "literal") from None
                langs[k.value] = entry
            consts[name] = langs
            continue
        try:
            consts[name] = ast.literal_eval(node.value)
        except ValueError:
            continue  # not a literal (a call, an expression): not part of the template
    return consts


def _check_builder(tree: ast.Module, path: Path) -> None:
    """``build_system_prompt`` must be the renderer this module reproduces: same arguments, a ``.format`` call with
    exactly the four placeholders, and the header/line pieces ``":「"``, ``"\\n"``, ``": "``, ``"\\n」"``."""
    fn = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "build_system_prompt"), None)
    if fn is None:
        raise _layout_error(path, "no function build_system_prompt")
    args = [a.arg for a in fn.args.args]
    if args != _BUILD_ARGS:
        raise _layout_error(path, f"build_system_prompt takes {args}, expected {_BUILD_ARGS}")
    pieces = {n.value for n in ast.walk(fn) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    lacking = [p for p in _BUILD_PIECES if p not in pieces]
    if not any(p.endswith(":\u300c") for p in pieces):
        lacking.append(":\u300c")
    if lacking:
        raise _layout_error(path, f"build_system_prompt lacks the string pieces {lacking}")
    calls = [n for n in ast.walk(fn) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
             and n.func.attr == "format"]
    if not any({k.arg for k in c.keywords} == _PLACEHOLDERS for c in calls):
        raise _layout_error(path, f"build_system_prompt does not call .format({', '.join(sorted(_PLACEHOLDERS))})")


def _git_commit(repo: Path) -> str | None:
    """The checked-out commit of ``repo`` read from ``.git`` (no subprocess); None when it cannot be read."""
    git = repo / ".git"
    try:
        head = (git / "HEAD").read_text().strip()
        if not head.startswith("ref: "):
            return head
        ref = head[5:]
        if (git / ref).is_file():
            return (git / ref).read_text().strip()
        for line in (git / "packed-refs").read_text().splitlines():
            if line.endswith(" " + ref):
                return line.split()[0]
    except OSError:
        return None
    return None


def _sha256(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def load_official_template(repo: str | Path) -> OfficialTemplate:
    """Read the official template from ``<repo>/eval/src/eval_common.py`` without executing it.

    Raises :class:`OfficialLayoutError` (naming the file, what was expected and the supported commit) when the file is
    missing or laid out differently.
    """
    repo = Path(repo).expanduser()
    path = repo / OFFICIAL_FILE
    if not path.is_file():
        raise _layout_error(path, "file not found (is --official_repo / "
                                  f"${OFFICIAL_REPO_ENV} the root of a UniGenBench clone?)")
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (SyntaxError, UnicodeDecodeError) as exc:
        raise _layout_error(path, f"cannot be parsed: {exc}") from None
    consts = _module_constants(tree, path)
    _check_builder(tree, path)
    configs = consts.get("LANG_CONFIGS")
    if not isinstance(configs, dict):
        raise _layout_error(path, "no LANG_CONFIGS dict")
    languages, sha = {}, {}
    for lang in LANGUAGES:
        cfg = configs.get(lang)
        if not isinstance(cfg, dict) or any(k not in cfg for k in _LANG_KEYS):
            raise _layout_error(path, f"LANG_CONFIGS[{lang!r}] lacks one of {list(_LANG_KEYS)}")
        template, defs = cfg["system_prompt_template"], cfg["explanation_dict"]
        if not isinstance(template, str):
            raise _layout_error(path, f"LANG_CONFIGS[{lang!r}]['system_prompt_template'] is not a string")
        try:
            fields = {f for _, f, _, _ in string.Formatter().parse(template) if f is not None}
        except ValueError as exc:
            raise _layout_error(path, f"the {lang} template is not a format string: {exc}") from None
        if fields != _PLACEHOLDERS:
            raise _layout_error(path, f"the {lang} template has placeholders {sorted(fields)}, expected "
                                      f"{sorted(_PLACEHOLDERS)}")
        if not (isinstance(defs, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in defs.items())):
            raise _layout_error(path, f"LANG_CONFIGS[{lang!r}]['explanation_dict'] is not a dict of strings")
        if not all(isinstance(cfg[k], str) for k in ("checkpoint_header", "checkpoint_desc_header")):
            raise _layout_error(path, f"LANG_CONFIGS[{lang!r}] headers are not strings")
        languages[lang] = OfficialLanguage(template, dict(defs), cfg["checkpoint_header"],
                                           cfg["checkpoint_desc_header"])
        suffix = lang.upper()
        sha[f"SYSTEM_PROMPT_{suffix}_TEMPLATE"] = _sha256(template)
        sha[f"EXPLANATION_DICT_{suffix}"] = _sha256(defs)
    template = OfficialTemplate(path=path, languages=languages, sha256=sha, repo_commit=_git_commit(repo))
    if not template.matches_supported_commit:
        logger.warning("%s: the layout is the supported one but the template text differs from UniGenBench commit %s "
                       "(sha256 mismatch); rendering your clone's text", path, SUPPORTED_OFFICIAL_COMMIT[:12])
    return template


def load_judge_template(official_repo: str | Path | None = None) -> ProjectTemplate | OfficialTemplate:
    """The official template read from ``official_repo`` when it is given, else the project's own."""
    return load_official_template(official_repo) if official_repo else ProjectTemplate()
