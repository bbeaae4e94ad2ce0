"""Eval YAML and prompt-file loading, including the four real UniGenBench CSVs."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from deepgen_rl.evaluation.config import load_eval_config, load_prompt_file, load_unigenbench_csv, split_dimension
from eval_helpers import SHARED_UNIGENBENCH, write_unigenbench_csv

REPO = Path(__file__).resolve().parents[2]
needs_data = pytest.mark.skipif(not SHARED_UNIGENBENCH.is_dir(), reason="../shared/data/unigenbench not present")

# total test points per file and the primary dimensions (counted once from the files, spot-checked by hand)
EN_PRIMARIES = {"Action", "Attribute", "Compound", "Entity Layout", "Grammar", "Logical Reasoning", "Relationship",
                "Style", "Text Generation", "World Knowledge"}
ZH_PRIMARIES = {"动作", "属性", "复合考点", "实体布局", "语法", "逻辑推理", "关系", "风格", "文本生成", "世界知识"}


@needs_data
@pytest.mark.parametrize("name,n_prompts,n_malformed,primaries", [
    ("en", 600, 0, EN_PRIMARIES), ("en_long", 599, 1, EN_PRIMARIES),
    ("zh", 600, 0, ZH_PRIMARIES), ("zh_long", 600, 0, ZH_PRIMARIES),
])
def test_real_unigenbench_csvs_parse(name, n_prompts, n_malformed, primaries):
    prompts, malformed = load_unigenbench_csv(SHARED_UNIGENBENCH / f"test_prompts_{name}.csv")
    assert len(prompts) == n_prompts and len(malformed) == n_malformed
    assert len(prompts) + len(malformed) == 600
    assert {tp.primary for p in prompts for tp in p.testpoints} == primaries
    assert len({tp.sub for p in prompts for tp in p.testpoints}) == 27
    assert all(p.testpoints for p in prompts)


@needs_data
def test_real_csv_rows_match_the_file():
    en, _ = load_unigenbench_csv(SHARED_UNIGENBENCH / "test_prompts_en.csv")
    assert sum(len(p.testpoints) for p in en) == 1813  # sum of the per-test-point counts of the file
    p0 = en[0]
    assert p0.index == 0 and p0.prompt.startswith("In the style of classical ink painting")
    assert [tp.name for tp in p0.testpoints] == ["Style", "World Knowledge", "Attribute - Quantity"]
    assert [tp.description for tp in p0.testpoints] == ["classical ink painting", "Egyptian pyramids", "two pandas"]
    assert [(tp.primary, tp.sub) for tp in p0.testpoints] == [
        ("Style", "Style"), ("World Knowledge", "World Knowledge"), ("Attribute", "Attribute - Quantity")]
    p1 = en[1]
    assert len(p1.testpoints) == 4
    assert p1.testpoints[0].sub == "Action - Hand (Character/Anthropomorphic)" and p1.testpoints[0].primary == "Action"
    assert p0.meta["Primary Categories"] == "Creative Divergence"

    zh, _ = load_unigenbench_csv(SHARED_UNIGENBENCH / "test_prompts_zh.csv")
    z1 = zh[1]
    assert z1.prompt.startswith("请绘制一幅画")
    assert [tp.name for tp in z1.testpoints] == ["动作-人物/拟人手部动作", "关系-构成关系", "动作-人物/拟人全身动作", "风格"]
    assert [tp.primary for tp in z1.testpoints] == ["动作", "关系", "动作", "风格"]
    assert z1.testpoints[0].description == "用戴着手套的手轻轻扶起"


@needs_data
def test_malformed_row_is_reported_and_logged(caplog):
    with caplog.at_level(logging.WARNING):
        prompts, malformed = load_unigenbench_csv(SHARED_UNIGENBENCH / "test_prompts_en_long.csv")
    assert [m.index for m in malformed] == ["509"]
    assert "JSON" in malformed[0].error
    assert 509 not in {p.index for p in prompts} and {508, 510} <= {p.index for p in prompts}
    assert any("index=509" in r.getMessage() for r in caplog.records)


def test_split_dimension():
    assert split_dimension("Entity Layout - Three-Dimensional Space") == (
        "Entity Layout", "Entity Layout - Three-Dimensional Space")
    assert split_dimension("属性-数量") == ("属性", "属性-数量")
    assert split_dimension("Logical Reasoning") == ("Logical Reasoning", "Logical Reasoning")


def test_demo_eval_yaml_loads():
    specs = load_eval_config(REPO / "assets/rl_datasets/demo/eval/eval_demo.yaml")
    assert [s.name for s in specs] == ["demo_unigenbench", "demo_txt"]
    ub, txt = specs
    assert ub.scoring == "unigenbench/en" and ub.language == "en" and len(ub.prompts) == 6 and not ub.malformed_rows
    assert all(p.testpoints for p in ub.prompts)
    assert txt.scoring is None and len(txt.prompts) == 3  # the blank line is skipped
    assert [p.index for p in txt.prompts] == [0, 1, 2]


def test_seed_eval_yaml_points_next_to_itself(tmp_path):
    """The repo's eval.yaml, copied to a folder without the CSVs (whether or not this clone has run
    scripts/download_data.sh, which puts them beside the original), names the file it misses."""
    src = REPO / "assets/rl_datasets/deepgen/eval/eval.yaml"
    (tmp_path / "bare").mkdir()
    (tmp_path / "bare" / "eval.yaml").write_text(src.read_text())
    with pytest.raises(FileNotFoundError, match=r"unigenbench_en.*test_prompts_en\.csv"):
        load_eval_config(tmp_path / "bare" / "eval.yaml")
    if SHARED_UNIGENBENCH.is_dir():  # the same YAML next to a link to the real files
        (tmp_path / "eval.yaml").write_text(src.read_text())
        (tmp_path / "unigenbench").symlink_to(SHARED_UNIGENBENCH.resolve())
        (spec,) = load_eval_config(tmp_path / "eval.yaml")
        assert (spec.name, spec.cfg_scale, spec.num_inference_steps, spec.duplicates, spec.scoring) == (
            "unigenbench_en", 4.0, 50, 4, "unigenbench/en")
        assert len(spec.prompts) == 600


def test_prompt_files_txt_jsonl(tmp_path):
    (tmp_path / "p.txt").write_text("a cat\n\n  \nb dog\n")
    prompts, bad = load_prompt_file(tmp_path / "p.txt")
    assert [p.prompt for p in prompts] == ["a cat", "b dog"] and not bad
    (tmp_path / "p.jsonl").write_text('{"prompt": "x"}\n{"caption": "y"}\n\n{"other": 1}\nnot json\n')
    prompts, bad = load_prompt_file(tmp_path / "p.jsonl")
    assert [p.prompt for p in prompts] == ["x", "y"]
    assert [b.index for b in bad] == ["line 4", "line 5"]


def test_yaml_errors(tmp_path):
    (tmp_path / "p.txt").write_text("a\n")
    (tmp_path / "e.yaml").write_text("datasets:\n  - {name: d, path: missing.txt}\n")
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        load_eval_config(tmp_path / "e.yaml")
    (tmp_path / "e.yaml").write_text("datasets:\n  - {name: d, path: p.txt, scoring: unigenbench/fr}\n")
    with pytest.raises(ValueError, match="scoring"):
        load_eval_config(tmp_path / "e.yaml")
    (tmp_path / "e.yaml").write_text("datasets:\n  - {name: d, path: p.txt, scoring: unigenbench/en}\n")
    with pytest.raises(ValueError, match="csv"):
        load_eval_config(tmp_path / "e.yaml")
    with pytest.raises(FileNotFoundError, match="nope.yaml"):
        load_eval_config(tmp_path / "nope.yaml")


def test_official_csv_headers_are_accepted(tmp_path):
    rows = [(0, "A fox.", ["Style"], ["ink"]), (1, "Two cups.", ["Attribute - Quantity"], ["two"])]
    ours, _ = load_unigenbench_csv(write_unigenbench_csv(tmp_path / "ours.csv", rows))
    official, _ = load_unigenbench_csv(write_unigenbench_csv(tmp_path / "off.csv", rows, header="en"), "en")
    assert ours == official and [p.prompt for p in official] == ["A fox.", "Two cups."]
    zh, _ = load_unigenbench_csv(write_unigenbench_csv(tmp_path / "zh.csv", [(0, "狐狸。", ["风格"], ["水墨"])],
                                                       header="zh"))
    assert zh[0].testpoints[0].name == "风格" and zh[0].meta["language"] == "zh"
    (tmp_path / "bad.csv").write_text("index,text,dims\n0,a,{}\n")
    with pytest.raises(ValueError, match=r"index,prompt,sub_dims or index,prompt_en,sub_dims_en"):
        load_unigenbench_csv(tmp_path / "bad.csv")
    with pytest.raises(ValueError, match="language 'zh' was requested"):
        load_unigenbench_csv(tmp_path / "off.csv", "zh")


def test_eval_yaml_resolution_per_dataset(tmp_path):
    (tmp_path / "p.txt").write_text("a\n")
    (tmp_path / "e.yaml").write_text("datasets:\n  - {name: d, path: p.txt, height: 1024, width: 768}\n"
                                     "  - {name: e, path: p.txt}\n")
    d, e = load_eval_config(tmp_path / "e.yaml")
    assert (d.height, d.width, e.height, e.width) == (1024, 768, None, None)
    for bad in ("height: 1024", "height: 1000, width: 1024", "height: big, width: 512"):
        (tmp_path / "e.yaml").write_text(f"datasets:\n  - {{name: d, path: p.txt, {bad}}}\n")
        with pytest.raises(ValueError, match="height"):
            load_eval_config(tmp_path / "e.yaml")
