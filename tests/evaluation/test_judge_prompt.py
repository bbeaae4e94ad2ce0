"""The judge instruction (project and official templates) and the official answer-parsing rule.

The official template is read from a FIXTURE repository (tests/evaluation/fixtures/unigenbench_official) with the
official file layout and made-up text; the expected renderings below are written out by hand."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from deepgen_rl.evaluation.config import EvalPrompt, EvalTestPoint, load_unigenbench_csv, split_dimension
from deepgen_rl.evaluation.judge_prompt import (
    SUPPORTED_OFFICIAL_COMMIT,
    MalformedAnswer,
    OfficialLayoutError,
    ProjectTemplate,
    load_judge_template,
    load_official_template,
    parse_answer,
)
from eval_helpers import SHARED_UNIGENBENCH

FIXTURE_REPO = Path(__file__).resolve().parent / "fixtures" / "unigenbench_official"
FIXTURE_FILE = FIXTURE_REPO / "eval" / "src" / "eval_common.py"


def _item(prompt, names, descs, index=0):
    return EvalPrompt(index, prompt, tuple(EvalTestPoint(n, d, *split_dimension(n)) for n, d in zip(names, descs)))


EN_ITEM = _item("Two owls on a branch.", ["Attribute - Quantity", "Style"], ["two owls", "pencil sketch"])
ZH_ITEM = _item("两只猫头鹰。", ["属性-数量", "风格"], ["两只", "铅笔素描"])

# written by hand from the fixture: the template's own indentation (12 / 16 spaces) is kept, the names list renders
# with str(list), each block is "<header>:「" + "\n<name>: <text>" per point + "\n」"
EXPECTED_EN = (
    "Fixture judge, made-up wording. Look at the picture and the request.\n"
    "            Request: 「Two owls on a branch.」, points: ['Attribute - Quantity', 'Style']\n"
    "            Fixture Definitions:「\n"
    "Attribute - Quantity: Fixture definition E09: look for attribute - quantity (made-up text).\n"
    "Style: Fixture definition E24: look for style (made-up text).\n"
    "」\n"
    "            Fixture Descriptions:「\n"
    "Attribute - Quantity: two owls\n"
    "Style: pencil sketch\n"
    "」\n"
    "            Think about each point, then give 1 (met) or 0 (not met) per point.\n"
    "            Reply as:\n"
    "            <description>\n"
    "                <prompt>Two owls on a branch.</prompt>\n"
    "                <checkpoint>['Attribute - Quantity', 'Style']</checkpoint>\n"
    "                <analysis>[one string per point]</analysis>\n"
    "                <score>[one 0/1 per point]</score>\n"
    "            </description>\n"
    "            "
)
EXPECTED_ZH_HEAD = (
    "夹具评审（虚构措辞）。请看图片和要求。\n"
    "        要求：「两只猫头鹰。」，考点：['属性-数量', '风格']\n"
    "        夹具定义:「\n属性-数量: 夹具定义 Z17：检查属性-数量（虚构文本）。\n风格: 夹具定义 Z26：检查风格（虚构文本）。\n」\n"
    "        夹具描述:「\n属性-数量: 两只\n风格: 铅笔素描\n」\n"
)


def test_official_template_renders_like_build_system_prompt_without_executing_the_file():
    template = load_official_template(FIXTURE_REPO)  # the fixture's first import would fail if it were executed
    assert "deepgen_rl_fixture_must_never_be_imported" not in sys.modules
    assert template.render(EN_ITEM, "en") == EXPECTED_EN
    assert template.render(ZH_ITEM, "zh").startswith(EXPECTED_ZH_HEAD)
    info = template.describe()
    assert info["kind"] == "official" and info["supported_commit"] == SUPPORTED_OFFICIAL_COMMIT
    assert info["matches_supported_commit"] is False  # made-up text: its sha256 differs from the official one
    assert len(info["sha256"]["SYSTEM_PROMPT_EN_TEMPLATE"]) == 64
    assert load_judge_template(FIXTURE_REPO).kind == "official" and load_judge_template(None).kind == "project"


def test_official_template_unknown_testpoint_is_refused():
    template = load_official_template(FIXTURE_REPO)
    bad = _item("x", ["Style", "Attribute - Smell"], ["a", "b"])
    assert template.unknown_testpoints([EN_ITEM, bad], "en") == ["Attribute - Smell"]
    assert template.unknown_testpoints([ZH_ITEM], "en") == ["属性-数量", "风格"]  # zh rows with the en template
    with pytest.raises(ValueError, match="Attribute - Smell"):
        template.render(bad, "en")


@pytest.mark.parametrize("old,new,match", [
    ("def build_system_prompt(prompt, testpoint, test_desc, lang):", "def build_system_prompt(prompt, points, lang):",
     "build_system_prompt takes"),
    ("def build_system_prompt(", "def build_prompt(", "no function build_system_prompt"),
    ("Request: 「{prompt}」", "Request: 「{user_prompt}」", "placeholders"),
    ('        "checkpoint_header": "夹具定义",\n', "", r"LANG_CONFIGS\['zh'\] lacks"),
    ('":\\u300c"', '"\\u300c"', "lacks the string pieces"),
    ("LANG_CONFIGS = {", "LANG_CONFIGS = dict(**{", "LANG_CONFIGS is not a dict literal"),
])
def test_unknown_official_layout_is_refused_naming_the_supported_commit(tmp_path, old, new, match):
    repo = tmp_path / "clone"
    shutil.copytree(FIXTURE_REPO, repo)
    path = repo / "eval" / "src" / "eval_common.py"
    text = path.read_text(encoding="utf-8")
    assert old in text
    if old == "LANG_CONFIGS = {":
        text = text.replace("\n}\n\n\ndef build", "\n})\n\n\ndef build")
    path.write_text(text.replace(old, new), encoding="utf-8")
    with pytest.raises(OfficialLayoutError, match=match) as err:
        load_official_template(repo)
    assert SUPPORTED_OFFICIAL_COMMIT[:12] in str(err.value) and "eval_common.py" in str(err.value)


def test_missing_official_file_is_refused(tmp_path):
    with pytest.raises(OfficialLayoutError, match="file not found.*UNIGENBENCH_OFFICIAL_REPO"):
        load_official_template(tmp_path)


@pytest.mark.skipif(not SHARED_UNIGENBENCH.is_dir(), reason="../shared/data/unigenbench not present")
def test_fixture_defines_every_test_point_of_the_real_csvs():
    """The fixture's made-up definitions use the 27 real names per language, so it stands in for the official file."""
    template = load_official_template(FIXTURE_REPO)
    for name, lang in (("en", "en"), ("en_long", "en"), ("zh", "zh"), ("zh_long", "zh")):
        prompts, _ = load_unigenbench_csv(SHARED_UNIGENBENCH / f"test_prompts_{name}.csv", lang)
        assert template.unknown_testpoints(prompts, lang) == []
        assert len({tp.name for p in prompts for tp in p.testpoints}) == 27


def test_project_template_asks_for_the_official_answer_layout():
    text = ProjectTemplate().render(EN_ITEM, "en")
    assert "「Two owls on a branch.」" in text and "1. Attribute - Quantity: two owls" in text
    assert text.index("<analysis>") < text.index("<score>") and "2 integers" in text
    zh = ProjectTemplate().render(ZH_ITEM, "zh")
    assert "1. 属性-数量：两只" in zh and "<analysis>" in zh
    with pytest.raises(ValueError, match="language"):
        ProjectTemplate().render(EN_ITEM, "fr")


def _answer(analysis, score):
    return f"<description><analysis>{analysis}</analysis>\n<score>{score}</score></description>"


def test_parse_answer_follows_the_official_rule():
    assert parse_answer(_answer("['a', 'b', 'c']", "[1, 0, 1]"), 3) == [1, 0, 1]
    assert parse_answer(_answer("('a', 'b')", "1, 0"), 2) == [1, 0]  # a tuple literal is accepted
    # only == 1 counts as met: True and 1.0 do, the string "1" and 2 do not
    assert parse_answer(_answer("['a', 'b', 'c', 'd']", "[True, 1.0, '1', 2]"), 4) == [1, 1, 0, 0]
    # the FIRST match of each tag is used, across lines
    text = _answer("[\n 'a',\n 'b'\n]", "[0, 1]") + "<score>[1, 1]</score>"
    assert parse_answer(text, 2) == [0, 1]


@pytest.mark.parametrize("text,why", [
    ("", "empty"),
    ("<score>[1, 0]</score>", "no <analysis>"),
    ("<analysis>['a', 'b']</analysis>", "no <score>"),
    ("<ANALYSIS>['a', 'b']</ANALYSIS><SCORE>[1, 0]</SCORE>", "no <analysis>"),  # tags are case-sensitive
    (_answer("['a', 'b']", "[1 0]"), "not a Python literal"),
    (_answer("['it's', 'b']", "[1, 0]"), "not a Python literal"),  # unescaped quote in the analysis
    (_answer("['a', 'b']", "[1, 0, 1]"), "<score> has 3 items"),
    (_answer("['a']", "[1, 0]"), "<analysis> has 1 items"),
    (_answer("['a', 'b']", "1"), "holds a int"),  # a bare scalar score
    (_answer("'ab'", "[1, 0]"), "holds a str"),
])
def test_parse_answer_rejects_malformed(text, why):
    with pytest.raises(MalformedAnswer, match=why):
        parse_answer(text, 2)


_REAL_REPO = os.environ.get("UNIGENBENCH_OFFICIAL_REPO")


@pytest.mark.skipif(not (_REAL_REPO and SHARED_UNIGENBENCH.is_dir()),
                    reason="opt-in: set UNIGENBENCH_OFFICIAL_REPO to a clone of the official repository")
def test_real_official_clone_renders_the_documented_lengths():
    """Against a real clone at the supported commit: the rendered instruction lengths (characters, per CSV) equal the
    min/mean/max measured from the official build_system_prompt (../shared/notes/unigenbench_protocol.md §2)."""
    template = load_official_template(_REAL_REPO)
    assert template.matches_supported_commit
    expected = {"en": (2674, 3385, 4215), "en_long": (4137, 4895, 5903), "zh": (942, 1146, 1407),
                "zh_long": (1365, 1595, 1867)}
    for name, (lo, mean, hi) in expected.items():
        lang = name.split("_")[0]
        prompts, _ = load_unigenbench_csv(SHARED_UNIGENBENCH / f"test_prompts_{name}.csv", lang)
        lengths = [len(template.render(p, lang)) for p in prompts]
        assert (min(lengths), round(sum(lengths) / len(lengths)), max(lengths)) == (lo, mean, hi), name
