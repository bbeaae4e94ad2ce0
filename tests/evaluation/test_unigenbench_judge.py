"""UniGenBench judge client against a real local HTTP server: parsing, retries, failures, accuracies, reports, CLI."""

from __future__ import annotations

import base64
import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from deepgen_rl.evaluation.config import load_unigenbench_csv
from deepgen_rl.evaluation.metrics import compute_unigenbench_summary, summary_to_metrics
from deepgen_rl.evaluation.judge_prompt import ProjectTemplate
from deepgen_rl.evaluation.unigenbench import (
    SERVED_MODEL_NAMES,
    JudgeConfig,
    UniGenBenchJudge,
    chat_completions_url,
    collect_image_requests,
    image_data_url,
    main,
    score_image_folder,
)
from eval_helpers import free_port, write_marker_image, write_unigenbench_csv

REPO = Path(__file__).resolve().parents[2]


def build_judge_prompt(item, language):
    return ProjectTemplate().render(item, language)
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
        (P0, 0, 1): ("seq", ["<score>[1, 1, 1]</score>", [1, 1, 1]]),   # no <analysis>, then fine on the retry
        (P0, 0, 2): ("text", "<analysis>['a', 'b', 'c']</analysis><score>1</score>"),  # bare scalar score
        (P1, 1, 0): ("text", "I think the image is nice."),               # garbage -> malformed
        (P1, 1, 1): ("fail_then_ok", 1, "[0, 1, 1]"),                      # 500 once, then success
        (P1, 1, 2): ("ok", "1, 1, 0"),                                      # a tuple literal is fine
        (P2, 2, 0): ("ok", "[1, 0, 1]"),                                    # wrong length -> malformed
        (P2, 2, 1): ("sleep", 3.0, "[1, 1]"),                               # always times out
        (P2, 2, 2): ("status", 503),                                        # always 5xx -> failed
    }
    judge.table.update(table)
    for _, index, dup in table:
        write_marker_image(images / f"{index}.{dup}.png", index, dup)
    cfg = JudgeConfig(api_url=judge.url + "/v1/", workers=4, timeout=0.5, max_retries=2, backoff=0.01,
                      answer_retries=2)
    return csv_path, images, cfg


# hand-computed from the table: judged images (0,0) (0,1) (1,1) (1,2)
EXPECTED_PRIMARY = {"Attribute": (4, 6), "Style": (3, 4), "Action": (2, 2)}
EXPECTED_SUB = {"Attribute - Color": (2, 2), "Attribute - Quantity": (2, 4), "Style": (3, 4), "Action - Animal": (2, 2)}
SCORE_KW = dict(images_per_prompt=3, progress=False)


def _check_summary(s):
    assert (s["num_images"], s["num_judged"], s["num_failed"]) == (9, 4, 5)
    assert (s["num_malformed_answers"], s["num_request_failed"]) == (3, 2)
    assert s["success_rate"] == pytest.approx(4 / 9)
    assert (s["num_testpoints_correct"], s["num_testpoints_judged"]) == (9, 12)
    assert s["testpoint_micro_acc"] == pytest.approx(0.75)
    assert s["primary_mean_acc"] == pytest.approx((4 / 6 + 3 / 4 + 1.0) / 3)
    assert s["overall"] is None and s["overall_missing_primaries"] == [
        "World Knowledge", "Relationship", "Compound", "Grammar", "Entity Layout", "Logical Reasoning",
        "Text Generation"]
    assert s["leaderboard_comparable"] is False
    assert {k: (v["correct"], v["total"]) for k, v in s["primary"].items()} == EXPECTED_PRIMARY
    assert {k: (v["correct"], v["total"]) for k, v in s["sub"].items()} == EXPECTED_SUB
    assert s["malformed_rows"][0]["index"] == "3" and s["num_malformed_rows"] == 1


def test_judge_accuracies_failures_retries_and_request_shape(tmp_path, fake_judge):
    csv_path, images, cfg = _setup(tmp_path, fake_judge)
    prompts, malformed = load_unigenbench_csv(csv_path)
    scan = collect_image_requests(images, prompts, "bench", images_per_prompt=3)
    assert len(scan.requests) == 9 and not scan.unknown and not scan.missing
    with UniGenBenchJudge(cfg) as judge:
        judgments = judge.judge_many(scan.requests, "en", progress=False)
    by_key = {(j.index, j.dup): j for j in judgments}
    assert by_key[(0, 0)].verdicts == [1, 0, 1] and by_key[(1, 2)].verdicts == [1, 1, 0]
    assert by_key[(0, 1)].verdicts == [1, 1, 1] and by_key[(0, 1)].answers == 2  # succeeded on the re-request
    for key in ((0, 2), (1, 0), (2, 0)):
        assert by_key[key].status == "malformed" and by_key[key].answers == 3, key
    assert "holds a int" in by_key[(0, 2)].error and "3 answers" in by_key[(0, 2)].error
    assert by_key[(2, 1)].status == "failed" and "Timeout" in by_key[(2, 1)].error
    assert by_key[(2, 2)].status == "failed" and "503" in by_key[(2, 2)].error
    # malformed answers: 1 + answer_retries requests; HTTP failures: 1 + max_retries requests, not re-asked after
    req = fake_judge.requests
    assert [req[(P0, 0, d)] for d in range(3)] == [1, 2, 3]
    assert [req[(P1, 1, d)] for d in range(3)] == [3, 2, 1] and by_key[(1, 1)].attempts == 2
    assert [req[(P2, 2, d)] for d in range(3)] == [3, 3, 3]
    assert sum(req.values()) == 21
    # one user message, image part (RGB JPEG) first, then the text; greedy; the seed moves on each re-request
    payloads = fake_judge.payloads_by_key[(P0, 0, 1)]
    content = payloads[0]["messages"][0]["content"]
    assert len(payloads[0]["messages"]) == 1 and payloads[0]["messages"][0]["role"] == "user"
    assert [c["type"] for c in content] == ["image_url", "text"]
    url = content[0]["image_url"]["url"]
    assert url.startswith("data:image/jpeg;base64,")
    img = Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1])))
    assert img.format == "JPEG" and img.mode == "RGB" and img.size == (16, 16)
    assert (payloads[0]["model"], payloads[0]["temperature"], payloads[0]["top_p"]) == ("UniGenBench-EvalModel", 0, 1)
    assert [p["seed"] for p in payloads] == [42, 43]
    assert content[1]["text"] == build_judge_prompt(prompts[0], "en")
    _check_summary(compute_unigenbench_summary("bench", prompts, judgments, language="en", malformed_rows=malformed))


def test_jpeg_reencoding_matches_pil_q95(tmp_path):
    rgba = Image.new("RGBA", (8, 8), (200, 10, 30, 128))
    rgba.save(tmp_path / "a.png")
    buf = io.BytesIO()
    rgba.convert("RGB").save(buf, format="JPEG", quality=95)
    assert image_data_url(tmp_path / "a.png") == "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode()


def test_unreachable_judge_fails_fast_and_counts(tmp_path):
    csv_path = write_unigenbench_csv(tmp_path / "b.csv", ROWS[:1])
    write_marker_image(tmp_path / "img" / "0.0.png", 0, 0)
    prompts, _ = load_unigenbench_csv(csv_path)
    scan = collect_image_requests(tmp_path / "img", prompts, "b")
    cfg = JudgeConfig(api_url=f"http://127.0.0.1:{free_port()}", timeout=1, max_retries=5, backoff=1.0)
    with UniGenBenchJudge(cfg) as judge:
        (j,) = judge.judge_many(scan.requests, "en", progress=False)
    assert j.status == "failed" and "unreachable" in j.error and j.attempts == 0
    s = compute_unigenbench_summary("b", prompts, [j], language="en")
    assert s["testpoint_micro_acc"] is None and s["overall"] is None and s["num_failed"] == 1
    assert s["success_rate"] == 0.0
    assert summary_to_metrics({"b": s}) == {"eval/b/num_images": 1.0, "eval/b/success_rate": 0.0,
                                            "eval/b/num_judged": 0.0, "eval/b/num_failed": 1.0,
                                            "eval/b/num_malformed_rows": 0.0}


def test_score_image_folder_writes_reports(tmp_path, fake_judge):
    csv_path, images, cfg = _setup(tmp_path, fake_judge)
    out = tmp_path / "report"
    summary = score_image_folder(images, csv_path, "en", out, dataset="bench", config=cfg, **SCORE_KW)
    _check_summary(summary)
    on_disk = json.loads((out / "unigenbench_summary.json").read_text())
    _check_summary(on_disk["bench"])
    assert on_disk["bench"]["protocol"]["template"]["kind"] == "project"
    assert on_disk["bench"]["image_size"] == [{"height": 16, "width": 16, "num_images": 9}]
    rows = list(csv.DictReader((out / "unigenbench_dimensions.csv").open()))
    got = {(r["level"], r["dimension"]): (r["correct"], r["total"], r["acc"]) for r in rows}
    assert got[("overall", "testpoint_micro_acc")] == ("9", "12", "0.750000")
    assert got[("overall", "overall")] == ("", "", "")
    assert got[("primary", "Attribute")] == ("4", "6", f"{4 / 6:.6f}")
    assert got[("sub", "Attribute - Quantity")] == ("2", "4", "0.500000")
    assert len((out / "judgments.jsonl").read_text().splitlines()) == 9
    html = (out / "index.html").read_text()
    assert "src='../images/0.1.png'" in html and (out / "../images/0.1.png").is_file()
    assert "Action - Hand (Character/Anthropomorphic)" in html and "malformed" in html
    assert "A broken row" not in html and "index 3" in html  # malformed row listed, not shown as a card
    assert "75.00%" in html and "66.67%" in html and "Not leaderboard-comparable" in html  # percentages in HTML
    metrics = summary_to_metrics(on_disk)
    assert metrics["eval/bench/testpoint_micro_acc"] == pytest.approx(0.75)
    assert "eval/bench/overall" not in metrics  # not all 10 primaries: not logged
    assert metrics["eval/bench/primary/Attribute"] == pytest.approx(4 / 6)
    assert metrics["eval/bench/sub/Attribute - Quantity"] == pytest.approx(0.5)
    assert all(len(k.split("/")) in (3, 4) for k in metrics)


def test_html_escapes_text(tmp_path, fake_judge):
    evil = "<script>alert('x')</script> & co"
    csv_path = write_unigenbench_csv(tmp_path / "b.csv", [(0, evil, ["Style"], ["<b>bold</b>"])])
    write_marker_image(tmp_path / "img" / "0.0.png", 0, 0)
    fake_judge.table[evil] = ("ok", "[1]")
    cfg = JudgeConfig(api_url=fake_judge.url, workers=2, timeout=5, max_retries=0)
    score_image_folder(tmp_path / "img", csv_path, "en", tmp_path / "out", config=cfg, images_per_prompt=1,
                       progress=False)
    html = (tmp_path / "out" / "index.html").read_text()
    assert "<script>" not in html and "&lt;script&gt;" in html and "&lt;b&gt;bold&lt;/b&gt;" in html


def test_cli_main_and_module_entry(tmp_path, fake_judge, capsys):
    csv_path, images, cfg = _setup(tmp_path, fake_judge)
    fake_judge.table[(P2, 2, 1)] = ("ok", "[0, 0]")  # keep the subprocess run fast
    args = ["--images", str(images), "--csv", str(csv_path), "--api_url", fake_judge.url, "--no_progress"]
    rc = main(args + ["--out", str(tmp_path / "o1"), "--workers", "3", "--max_retries", "1", "--timeout", "5",
                      "--answer_retries", "1", "--images_per_prompt", "3", "--language", "en"])
    assert rc == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["num_images"] == 9 and printed["num_judged"] == 5 and printed["template"] == "project"
    assert printed["protocol"]["decoding"].startswith("greedy")
    # the default --images_per_prompt 4 finds missing images and refuses, naming them
    assert main(args + ["--out", str(tmp_path / "o2")]) == 2
    err = capsys.readouterr().err
    assert "3 images missing" in err and "0_3" in err and "--allow_missing" in err
    env = dict(os.environ, UNIGENBENCH_API_URL=fake_judge.url, UNIGENBENCH_MAX_RETRIES="1",
               UNIGENBENCH_ANSWER_RETRIES="0")
    before = sum(fake_judge.requests.values())
    proc = subprocess.run([sys.executable, "-m", "deepgen_rl.evaluation.unigenbench", "--images", str(images),
                           "--csv", str(csv_path), "--no_progress", "--allow_missing"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["num_judged"] == 5
    # UNIGENBENCH_ANSWER_RETRIES=0: one request per image, plus one HTTP retry for the 503
    assert sum(fake_judge.requests.values()) - before == 9 + 1
    summary = json.loads((images / "unigenbench_summary.json").read_text())["unigenbench_en"]
    assert summary["num_failed"] == 4 and summary["num_malformed_rows"] == 1
    assert summary["missing_images"] == ["0_3", "1_3", "2_3"] and summary["leaderboard_comparable"] is False
    assert "malformed row index=3" in proc.stderr


def _launcher(*args, **env_extra):
    script = REPO / "scripts/eval_unigenbench_evalmodel.sh"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UNIGENBENCH_", "VLLM_"))}
    env.update(env_extra)
    return subprocess.run(["bash", str(script), *args], env=env, capture_output=True, text=True, timeout=30)


def test_launch_script_dry_run():
    out = _launcher("--dry-run")
    assert out.returncode == 0
    assert out.stdout.split() == [
        "vllm", "serve", "CodeGoat24/UniGenBench-EvalModel-qwen3vl-32b-v1", "--host", "127.0.0.1", "--port", "8000",
        "--served-model-name", JudgeConfig().model, "--data-parallel-size", "1", "--tensor-parallel-size", "1",
        "--trust-remote-code"]
    out = _launcher("--dry-run", "--tensor-parallel-size", "2", "--", "--max-num-seqs", "8",
                    UNIGENBENCH_PORT="8123", VLLM_DATA_PARALLEL_SIZE="4", UNIGENBENCH_MODEL="/models/judge")
    words = out.stdout.split()
    assert words[2] == "/models/judge" and words[words.index("--port") + 1] == "8123"
    assert words[words.index("--data-parallel-size") + 1] == "4"
    assert words[words.index("--tensor-parallel-size") + 1] == "2" and words[-2:] == ["--max-num-seqs", "8"]
    out = _launcher(PATH="/usr/bin:/bin")  # no vllm there
    assert out.returncode != 0 and "vllm" in out.stderr


def test_launch_script_official_mode_and_client_default_name():
    out = _launcher("--mode", "official", "--dry-run")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [
        "vllm", "serve", "CodeGoat24/UniGenBench-EvalModel-qwen3vl-32b-v1", "--host", "127.0.0.1", "--port", "8000",
        "--served-model-name", "QwenVL", "--trust-remote-code", "--gpu-memory-utilization", "0.9",
        "--tensor-parallel-size", "8", "--pipeline-parallel-size", "1", "--limit-mm-per-prompt.image", "2"]
    # the client's default model name in each protocol is the launcher's served name
    assert JudgeConfig(official_repo="/x").model == SERVED_MODEL_NAMES["official"] == "QwenVL"
    assert JudgeConfig().model == SERVED_MODEL_NAMES["project"]
    words = _launcher("--dry-run", UNIGENBENCH_SERVE_MODE="official",
                      UNIGENBENCH_MODEL="CodeGoat24/UniGenBench-EvalModel-qwen-72b-v1").stdout.split()
    assert words[words.index("--tensor-parallel-size") + 1] == "4"
    bad = _launcher("--mode", "fast", "--dry-run")
    assert bad.returncode == 2 and "project' or 'official" in bad.stderr


def test_chat_completions_url():
    for url in ("http://h:8000", "http://h:8000/", "http://h:8000/v1", "http://h:8000/v1/chat/completions"):
        assert chat_completions_url(url) == "http://h:8000/v1/chat/completions"
