"""UniGenBench judge client against a real local HTTP server: parsing, retries, failures, accuracies, reports, CLI."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from deepgen_rl.evaluation.config import load_unigenbench_csv
from deepgen_rl.evaluation.metrics import compute_unigenbench_summary, summary_to_metrics
from deepgen_rl.evaluation.unigenbench import (
    JudgeConfig,
    UniGenBenchJudge,
    build_judge_prompt,
    chat_completions_url,
    collect_image_requests,
    main,
    parse_score,
    score_image_folder,
)
from eval_helpers import free_port, write_marker_image, write_unigenbench_csv

REPO = Path(__file__).resolve().parents[2]
P0 = "A red apple and a green pear."
P1 = "Two cats sleeping on a sofa."
P2 = "A chef waving, a sign that reads OPEN."
ROWS = [
    (0, P0, ["Attribute - Color", "Attribute - Quantity", "Style"], ["red apple", "two fruits", "photo"]),
    (1, P1, ["Attribute - Quantity", "Action - Animal", "Style"], ["two cats", "sleeping", "plain"]),
    (2, P2, ["Text Generation", "Action - Hand (Character/Anthropomorphic)"], ["OPEN", "waving"]),
    (3, "A broken row.", '{"Testpoints": ["Style" "World Knowledge"], "Testpoint Description": ["a", "b"]}'),
]


def _setup(tmp_path, judge):
    csv_path = write_unigenbench_csv(tmp_path / "bench.csv", ROWS)
    images = tmp_path / "images"
    table = {
        (P0, 0, 0): ("ok", "[1, 0, 1]"),
        (P0, 0, 1): ("ok", "[1,1,1]"),
        (P1, 1, 0): ("text", "I think the image is nice."),               # garbage -> malformed
        (P1, 1, 1): ("fail_then_ok", 1, "[0, 1, 1]"),                      # 500 once, then success
        (P1, 1, 2): ("ok", "1, 1, 0"),                                      # no brackets is fine
        (P2, 2, 0): ("ok", "[1, 0, 1]"),                                    # wrong length -> malformed
        (P2, 2, 1): ("sleep", 3.0, "[1, 1]"),                               # always times out
        (P2, 2, 2): ("status", 503),                                        # always 5xx -> failed
    }
    judge.table.update(table)
    for _, index, dup in table:
        write_marker_image(images / f"{index}.{dup}.png", index, dup)
    cfg = JudgeConfig(api_url=judge.url + "/v1/", workers=4, timeout=0.5, max_retries=2, backoff=0.01)
    return csv_path, images, cfg


# hand-computed from the table: judged images (0,0) (0,1) (1,1) (1,2)
EXPECTED_PRIMARY = {"Attribute": (4, 6), "Style": (3, 4), "Action": (2, 2)}
EXPECTED_SUB = {"Attribute - Color": (2, 2), "Attribute - Quantity": (2, 4), "Style": (3, 4), "Action - Animal": (2, 2)}


def _check_summary(s):
    assert (s["num_images"], s["num_judged"], s["num_failed"]) == (8, 4, 4)
    assert (s["num_malformed_answers"], s["num_request_failed"]) == (2, 2)
    assert s["success_rate"] == pytest.approx(0.5)
    assert (s["num_testpoints_correct"], s["num_testpoints_judged"]) == (9, 12)
    assert s["overall_acc"] == pytest.approx(0.75)
    assert s["primary_mean_acc"] == pytest.approx((4 / 6 + 3 / 4 + 1.0) / 3)
    assert {k: (v["correct"], v["total"]) for k, v in s["primary"].items()} == EXPECTED_PRIMARY
    assert {k: (v["correct"], v["total"]) for k, v in s["sub"].items()} == EXPECTED_SUB
    assert s["malformed_rows"][0]["index"] == "3" and s["num_malformed_rows"] == 1


def test_parse_score():
    assert parse_score("<think>x</think><score>[1, 0, 1]</score>", 3) == [1, 0, 1]
    assert parse_score("<score>[0]</score> then <SCORE> [1.0, 0] </SCORE>", 2) == [1, 0]
    for bad in ("", "no tags", "<score>[1, 0]</score>", "<score>[1, 2, 0]</score>", "<score>[yes, 0, 1]</score>"):
        with pytest.raises(ValueError):
            parse_score(bad, 3)


def test_url_and_prompt_builders():
    for url in ("http://h:8000", "http://h:8000/", "http://h:8000/v1", "http://h:8000/v1/chat/completions"):
        assert chat_completions_url(url) == "http://h:8000/v1/chat/completions"
    prompts, _ = load_unigenbench_csv(REPO / "assets/rl_datasets/demo/eval/demo_unigenbench.csv")
    text = build_judge_prompt(prompts[0], "en")
    assert prompts[0].prompt in text and "1. Attribute - Color: red apple, green pear" in text
    assert "exactly 3 integers" in text and "<score>" in text
    assert "考点" in build_judge_prompt(prompts[0], "zh")


def test_judge_accuracies_failures_and_bounded_retries(tmp_path, fake_judge):
    csv_path, images, cfg = _setup(tmp_path, fake_judge)
    prompts, malformed = load_unigenbench_csv(csv_path)
    requests, unknown = collect_image_requests(images, prompts, "bench")
    assert len(requests) == 8 and not unknown
    with UniGenBenchJudge(cfg) as judge:
        judgments = judge.judge_many(requests, "en", progress=False)
    by_key = {(j.index, j.dup): j for j in judgments}
    assert by_key[(0, 0)].verdicts == [1, 0, 1] and by_key[(1, 2)].verdicts == [1, 1, 0]
    assert by_key[(1, 0)].status == "malformed" and by_key[(2, 0)].status == "malformed"
    assert by_key[(2, 1)].status == "failed" and "Timeout" in by_key[(2, 1)].error
    assert by_key[(2, 2)].status == "failed" and "503" in by_key[(2, 2)].error
    # retries: at most 1 + max_retries requests; malformed answers are not retried
    req = fake_judge.requests
    assert req[(P1, 1, 1)] == 2 and by_key[(1, 1)].attempts == 2
    assert req[(P2, 2, 1)] == 3 and req[(P2, 2, 2)] == 3
    assert req[(P1, 1, 0)] == 1 and req[(P2, 2, 0)] == 1
    assert sum(req.values()) == 1 + 1 + 1 + 2 + 1 + 1 + 3 + 3
    p = fake_judge.payloads[0]
    assert p["model"] == "UniGenBench-EvalModel" and p["temperature"] == 0 and p["seed"] == 42
    assert p["messages"][0]["content"][0]["image_url"]["url"].startswith("data:image/png;base64,")
    _check_summary(compute_unigenbench_summary("bench", prompts, judgments, language="en", malformed_rows=malformed))


def test_unreachable_judge_fails_fast_and_counts(tmp_path):
    csv_path = write_unigenbench_csv(tmp_path / "b.csv", ROWS[:1])
    write_marker_image(tmp_path / "img" / "0.0.png", 0, 0)
    prompts, _ = load_unigenbench_csv(csv_path)
    requests, _ = collect_image_requests(tmp_path / "img", prompts, "b")
    cfg = JudgeConfig(api_url=f"http://127.0.0.1:{free_port()}", timeout=1, max_retries=5, backoff=1.0)
    with UniGenBenchJudge(cfg) as judge:
        (j,) = judge.judge_many(requests, "en", progress=False)
    assert j.status == "failed" and "unreachable" in j.error and j.attempts == 0
    s = compute_unigenbench_summary("b", prompts, [j], language="en")
    assert s["overall_acc"] is None and s["num_failed"] == 1 and s["success_rate"] == 0.0
    assert summary_to_metrics({"b": s}) == {"eval/b/num_images": 1.0, "eval/b/success_rate": 0.0,
                                            "eval/b/num_judged": 0.0, "eval/b/num_failed": 1.0,
                                            "eval/b/num_malformed_rows": 0.0}


def test_score_image_folder_writes_reports(tmp_path, fake_judge):
    csv_path, images, cfg = _setup(tmp_path, fake_judge)
    out = tmp_path / "report"
    summary = score_image_folder(images, csv_path, "en", out, dataset="bench", config=cfg, progress=False)
    _check_summary(summary)
    on_disk = json.loads((out / "unigenbench_summary.json").read_text())
    _check_summary(on_disk["bench"])
    rows = list(csv.DictReader((out / "unigenbench_dimensions.csv").open()))
    got = {(r["level"], r["dimension"]): (int(r["correct"]), int(r["total"]), float(r["acc"])) for r in rows}
    assert got[("overall", "overall")] == (9, 12, 0.75)
    assert got[("primary", "Attribute")] == (4, 6, pytest.approx(4 / 6, abs=1e-6))
    assert got[("sub", "Attribute - Quantity")] == (2, 4, 0.5)
    assert len((out / "judgments.jsonl").read_text().splitlines()) == 8
    html = (out / "index.html").read_text()
    assert "src='../images/0.1.png'" in html and (out / "../images/0.1.png").is_file()
    assert "Action - Hand (Character/Anthropomorphic)" in html and "malformed" in html
    assert "A broken row" not in html and "index 3" in html  # malformed row listed, not shown as a card
    metrics = summary_to_metrics(on_disk)
    assert metrics["eval/bench/overall_acc"] == pytest.approx(0.75)
    assert metrics["eval/bench/primary/Attribute"] == pytest.approx(4 / 6)
    assert metrics["eval/bench/sub/Attribute - Quantity"] == pytest.approx(0.5)
    assert all(len(k.split("/")) in (3, 4) for k in metrics)


def test_html_escapes_text(tmp_path, fake_judge):
    evil = "<script>alert('x')</script> & co"
    csv_path = write_unigenbench_csv(tmp_path / "b.csv", [(0, evil, ["Style"], ["<b>bold</b>"])])
    write_marker_image(tmp_path / "img" / "0.0.png", 0, 0)
    fake_judge.table[evil] = ("ok", "[1]")
    cfg = JudgeConfig(api_url=fake_judge.url, workers=2, timeout=5, max_retries=0)
    score_image_folder(tmp_path / "img", csv_path, "en", tmp_path / "out", config=cfg, progress=False)
    html = (tmp_path / "out" / "index.html").read_text()
    assert "<script>" not in html and "&lt;script&gt;" in html and "&lt;b&gt;bold&lt;/b&gt;" in html


def test_cli_main_and_module_entry(tmp_path, fake_judge, capsys):
    csv_path, images, cfg = _setup(tmp_path, fake_judge)
    fake_judge.table[(P2, 2, 1)] = ("ok", "[0, 0]")  # keep the subprocess run fast
    rc = main(["--images", str(images), "--csv", str(csv_path), "--language", "en", "--out", str(tmp_path / "o1"),
               "--api_url", fake_judge.url, "--workers", "3", "--max_retries", "1", "--timeout", "5", "--no_progress"])
    assert rc == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["num_images"] == 8 and printed["num_judged"] == 5
    env = dict(os.environ, UNIGENBENCH_API_URL=fake_judge.url, UNIGENBENCH_MAX_RETRIES="1")
    proc = subprocess.run([sys.executable, "-m", "deepgen_rl.evaluation.unigenbench", "--images", str(images),
                           "--csv", str(csv_path), "--language", "en", "--no_progress"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["num_judged"] == 5
    summary = json.loads((images / "unigenbench_summary.json").read_text())["unigenbench_en"]
    assert summary["num_failed"] == 3 and summary["num_malformed_rows"] == 1
    assert "malformed row index=3" in proc.stderr


def test_launch_script_dry_run():
    script = REPO / "scripts/eval_unigenbench_evalmodel.sh"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UNIGENBENCH_", "VLLM_"))}
    out = subprocess.run(["bash", str(script), "--dry-run"], env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0
    assert out.stdout.split() == [
        "vllm", "serve", "CodeGoat24/UniGenBench-EvalModel-qwen3vl-32b-v1", "--host", "127.0.0.1", "--port", "8000",
        "--served-model-name", JudgeConfig().model, "--data-parallel-size", "1", "--tensor-parallel-size", "1",
        "--trust-remote-code"]
    env.update(UNIGENBENCH_PORT="8123", VLLM_DATA_PARALLEL_SIZE="4", UNIGENBENCH_MODEL="/models/judge")
    out = subprocess.run(["bash", str(script), "--dry-run", "--tensor-parallel-size", "2", "--", "--max-num-seqs", "8"],
                         env=env, capture_output=True, text=True, timeout=30)
    words = out.stdout.split()
    assert words[2] == "/models/judge" and words[words.index("--port") + 1] == "8123"
    assert words[words.index("--data-parallel-size") + 1] == "4"
    assert words[words.index("--tensor-parallel-size") + 1] == "2" and words[-2:] == ["--max-num-seqs", "8"]
    env["PATH"] = "/usr/bin:/bin"  # no vllm there
    out = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode != 0 and "vllm" in out.stderr
