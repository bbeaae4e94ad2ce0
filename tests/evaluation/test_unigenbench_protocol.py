"""Official vs project protocol against one fake judge answering in the official layout: the same verdicts give the
same accuracies, the request and the summary say which protocol was used; overall = mean of the 10 primaries;
official CSV headers and image layout; missing images."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from deepgen_rl.evaluation.config import load_unigenbench_csv
from deepgen_rl.evaluation.judge_prompt import load_official_template
from deepgen_rl.evaluation.metrics import compute_unigenbench_summary, summary_to_metrics
from deepgen_rl.evaluation.unigenbench import JudgeConfig, collect_image_requests, main, score_image_folder
from eval_helpers import write_marker_image, write_unigenbench_csv

FIXTURE_REPO = Path(__file__).resolve().parent / "fixtures" / "unigenbench_official"
Q0 = "A fox reading a map under a lamp."
Q1 = "Three cups, none of them red, with the word TEA."
TP0 = ["Style", "World Knowledge", "Attribute - Color", "Action - Animal", "Relationship - Comparison"]
TP1 = ["Compound - Imagination", "Grammar - Negation", "Entity Layout - Two-Dimensional Space", "Logical Reasoning",
       "Text Generation"]
ROWS10 = [(0, Q0, TP0, ["ink", "map", "orange fox", "reading", "fox bigger than lamp"]),
          (1, Q1, TP1, ["cups that float", "not red", "in a row", "three", "TEA"])]
TABLE10 = {
    (Q0, 0, 0): ("ok", [1, 1, 1, 1, 1]),
    (Q0, 0, 1): ("ok", [1, 0, 1, 0, 1]),
    (Q1, 1, 0): ("seq", ["<score>[1, 1, 0, 0, 1]</score>", [1, 1, 0, 0, 1]]),  # no <analysis>, fine on the retry
    (Q1, 1, 1): ("text", "<analysis>['a', 'b', 'c', 'd', 'e']</analysis><score>1</score>"),  # bare scalar: excluded
}
# per primary (pooled over judged images): Style 2/2, World Knowledge 1/2, Attribute 2/2, Action 1/2,
# Relationship 2/2 (image 0_0 and 0_1); Compound 1/1, Grammar 1/1, Entity Layout 0/1, Logical Reasoning 0/1,
# Text Generation 1/1 (image 1_0 only)
OVERALL = (1 + 0.5 + 1 + 0.5 + 1 + 1 + 1 + 0 + 0 + 1) / 10
MICRO = (8 + 3) / (10 + 5)


def _bench(tmp_path, judge, header=None, layout="_"):
    csv_path = write_unigenbench_csv(tmp_path / "bench.csv", ROWS10, header=header)
    for (_, index, k) in TABLE10:
        write_marker_image(tmp_path / "images" / f"{index}{layout}{k}.png", index, k)
    judge.table.update(TABLE10)
    return csv_path, tmp_path / "images"


def _cfg(judge, **kw):
    return JudgeConfig(api_url=judge.url, workers=2, timeout=5, max_retries=1, backoff=0.01, **kw)


def test_official_and_project_protocols_on_the_same_fake_judge(tmp_path, fake_judge):
    csv_path, images = _bench(tmp_path, fake_judge, header="en")
    kw = dict(dataset="bench", images_per_prompt=2, progress=False)
    official = score_image_folder(images, csv_path, None, tmp_path / "official",
                                  config=_cfg(fake_judge, official_repo=str(FIXTURE_REPO)), **kw)
    official_payloads = list(fake_judge.payloads)
    project = score_image_folder(images, csv_path, None, tmp_path / "project", config=_cfg(fake_judge), **kw)
    for s in (official, project):
        assert s["language"] == "en" and (s["num_images"], s["num_judged"], s["num_malformed_answers"]) == (4, 3, 1)
        assert s["overall"] == pytest.approx(OVERALL) and s["overall_missing_primaries"] == []
        assert s["testpoint_micro_acc"] == pytest.approx(MICRO) and s["primary_mean_acc"] == pytest.approx(OVERALL)
        assert s["primary"]["World Knowledge"] == {"correct": 1, "total": 2, "acc": 0.5}
        assert s["sub"]["Entity Layout - Two-Dimensional Space"] == {"correct": 0, "total": 1, "acc": 0.0}
    # (1, 0) was re-requested once in each run; (1, 1) 1 + 10 answers in each run
    assert fake_judge.requests[(Q1, 1, 0)] == 2 + 1 and fake_judge.requests[(Q1, 1, 1)] == 11 * 2
    assert official["leaderboard_comparable"] is True and official["not_comparable_because"] == []
    assert project["leaderboard_comparable"] is False
    assert "project judge template" in project["not_comparable_because"][0]
    assert official["protocol"]["template"]["kind"] == "official"
    assert project["protocol"]["template"]["kind"] == "project"
    assert official["protocol"]["model"] == "QwenVL" and project["protocol"]["model"] == "UniGenBench-EvalModel"
    assert official["protocol"]["sampling"] == {"temperature": None, "top_p": None, "seed": None, "max_tokens": 4096}
    assert "server defaults" in official["protocol"]["decoding"] and "greedy" in project["protocol"]["decoding"]
    assert "Gemini-2.5-Pro" in official["protocol"]["judge_caveat"]
    # official requests: no sampling fields, the official rendering of the fixture template
    body = next(p for p in official_payloads if Q0 in p["messages"][0]["content"][1]["text"])
    assert not {"temperature", "top_p", "seed"} & set(body) and body["max_tokens"] == 4096
    prompts, _ = load_unigenbench_csv(csv_path, "en")
    assert body["messages"][0]["content"][1]["text"] == load_official_template(FIXTURE_REPO).render(prompts[0], "en")
    on_disk = json.loads((tmp_path / "official" / "unigenbench_summary.json").read_text())["bench"]
    assert on_disk["overall"] == pytest.approx(OVERALL) and on_disk["leaderboard_comparable"] is True
    html = (tmp_path / "official" / "index.html").read_text()
    assert f"{100 * OVERALL:.2f}%" in html and f"{100 * MICRO:.2f}%" in html
    assert "comparable with the leaderboard" in html
    metrics = summary_to_metrics({"bench": official})
    assert metrics["eval/bench/overall"] == pytest.approx(OVERALL)
    assert metrics["eval/bench/testpoint_micro_acc"] == pytest.approx(MICRO)


def test_sampling_override_in_official_mode_is_recorded_and_not_comparable(tmp_path, fake_judge):
    csv_path, images = _bench(tmp_path, fake_judge)
    cfg = _cfg(fake_judge, official_repo=str(FIXTURE_REPO), temperature=0.0, answer_retries=0)
    s = score_image_folder(images, csv_path, "en", tmp_path / "o", config=cfg, images_per_prompt=2, progress=False)
    assert s["protocol"]["sampling_overridden"] is True and s["leaderboard_comparable"] is False
    assert fake_judge.payloads[0]["temperature"] == 0.0 and "seed" not in fake_judge.payloads[0]


def test_overall_needs_all_ten_primaries(tmp_path):
    prompts, _ = load_unigenbench_csv(write_unigenbench_csv(tmp_path / "b.csv", ROWS10))
    ok = [{"dataset": "b", "index": 0, "dup": 0, "rel_path": "0_0.png", "status": "ok", "verdicts": [1, 0, 1, 1, 1]}]
    s = compute_unigenbench_summary("b", prompts, ok, language="en")
    assert s["overall"] is None and s["overall_missing_primaries"] == [
        "Compound", "Grammar", "Entity Layout", "Logical Reasoning", "Text Generation"]
    assert s["primary_mean_acc"] == pytest.approx(0.8) and s["testpoint_micro_acc"] == pytest.approx(0.8)
    assert "overall missing" in s["not_comparable_because"][-1]
    # Chinese primary names: the key before the first hyphen
    zh_rows = [(0, "一只狐狸。", ["风格", "世界知识", "属性-颜色", "动作-动物动作", "关系-比较关系"], list("abcde")),
               (1, "三个杯子。", ["复合考点-想象力", "语法-否定", "实体布局-二维空间", "逻辑推理", "文本生成"], list("abcde"))]
    zh_prompts, _ = load_unigenbench_csv(write_unigenbench_csv(tmp_path / "z.csv", zh_rows, header="zh"), "zh")
    js = [{"dataset": "z", "index": i, "dup": 0, "rel_path": "x", "status": "ok", "verdicts": [1, 1, 1, 1, i]}
          for i in (0, 1)]
    s = compute_unigenbench_summary("z", zh_prompts, js, language="zh")
    assert s["overall"] == pytest.approx(0.9) and s["primary"]["属性"]["total"] == 1


def test_official_layout_missing_images_and_both_layouts(tmp_path, fake_judge):
    csv_path, images = _bench(tmp_path, fake_judge, layout="_")
    prompts, _ = load_unigenbench_csv(csv_path)
    scan = collect_image_requests(images, prompts, "b", images_per_prompt=3)
    assert [(r.item.index, r.dup) for r in scan.requests] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert scan.missing == ["0_2", "1_2"]
    write_marker_image(images / "0_5.png", 0, 5)
    write_marker_image(images / "7_0.png", 7, 0)
    scan = collect_image_requests(images, prompts, "b", images_per_prompt=2)
    assert scan.missing == [] and scan.ignored == ["0_5.png"] and scan.unknown == ["7_0.png"]
    with pytest.raises(FileNotFoundError, match=r"2 images missing.*'0_2', '1_2'.*--allow_missing"):
        score_image_folder(images, csv_path, "en", tmp_path / "o", config=_cfg(fake_judge), images_per_prompt=3,
                           progress=False)
    assert sum(fake_judge.requests.values()) == 0  # refused before asking the judge
    write_marker_image(images / "1.1.png", 1, 1)
    with pytest.raises(ValueError, match="exists twice"):
        collect_image_requests(images, prompts, "b", images_per_prompt=2)


def test_unknown_testpoint_refused_before_any_request(tmp_path, fake_judge, capsys):
    rows = [(0, Q0, ["Style", "Attribute - Smell"], ["ink", "smoky"])]
    csv_path = write_unigenbench_csv(tmp_path / "b.csv", rows)
    write_marker_image(tmp_path / "img" / "0_0.png", 0, 0)
    fake_judge.table[Q0] = ("ok", [1, 1])
    rc = main(["--images", str(tmp_path / "img"), "--csv", str(csv_path), "--official_repo", str(FIXTURE_REPO),
               "--images_per_prompt", "1", "--api_url", fake_judge.url, "--no_progress"])
    assert rc == 2 and "Attribute - Smell" in capsys.readouterr().err
    rc = main(["--images", str(tmp_path / "img"), "--csv", str(csv_path), "--official_repo", str(tmp_path),
               "--images_per_prompt", "1", "--api_url", fake_judge.url, "--no_progress"])
    assert rc == 2 and "49d0bcebb0b9" in capsys.readouterr().err
    assert sum(fake_judge.requests.values()) == 0


def test_zh_official_header_and_language_checks(tmp_path, fake_judge):
    zh_rows = [(0, "一只狐狸在看地图。", ["风格", "属性-颜色"], ["水墨", "橙色"])]
    csv_path = write_unigenbench_csv(tmp_path / "zh.csv", zh_rows, header="zh")
    write_marker_image(tmp_path / "img" / "0_0.png", 0, 0)
    fake_judge.table["一只狐狸在看地图。"] = ("ok", [1, 0])
    s = score_image_folder(tmp_path / "img", csv_path, None, tmp_path / "o",
                           config=_cfg(fake_judge, official_repo=str(FIXTURE_REPO)), images_per_prompt=1,
                           progress=False)
    assert s["dataset"] == "unigenbench_zh" and s["primary"] == {"属性": {"correct": 0, "total": 1, "acc": 0.0},
                                                                 "风格": {"correct": 1, "total": 1, "acc": 1.0}}
    text = fake_judge.payloads[0]["messages"][0]["content"][1]["text"]
    assert "夹具定义:「\n风格: 夹具定义 Z26" in text
    with pytest.raises(ValueError, match="language 'en' was requested"):
        load_unigenbench_csv(csv_path, "en")
