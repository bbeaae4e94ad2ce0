"""UnifiedReward-Think client against a real local HTTP judge: win rates, both orders, failures and retries."""

import pytest
from PIL import Image

from deepgen_rl.rewards import get_reward
from deepgen_rl.rewards.unifiedreward import parse_pairwise_answer
from fake_judge_server import FakeJudge


def gray(level: float) -> Image.Image:
    return Image.new("RGB", (32, 32), (round(level * 255),) * 3)


def group(caption: str, gid: str, levels: list[float]):
    return [gray(v) for v in levels], [caption] * len(levels), [{"group_id": gid} for _ in levels]


def batch(*groups):
    images, prompts, meta = [], [], []
    for g in groups:
        images += g[0]
        prompts += g[1]
        meta += g[2]
    return images, prompts, meta


@pytest.fixture
def judge():
    with FakeJudge() as server:
        yield server


def make(judge, **kw):
    kw.setdefault("backoff_s", 0.01)
    return get_reward("unifiedreward_think", url=judge.url, **kw)


@pytest.mark.parametrize(
    "text, verdict",
    [
        ("<think>...</think><answer>Image 1 is better</answer>", 1),
        ("<think>Image 1 is better? no</think>\n<answer> image 2 IS better. </answer>", 2),
        ("<think><answer>Image 1 is better</answer></think><answer>Image 2 is better</answer>", 2),
        ("<answer>Image 1 is better than Image 2 is better</answer>", None),  # names both
        ("<answer>They are equal</answer>", None),
        ("Image 1 is better", None),  # no answer tag
        ("", None),
        (None, None),
    ],
)
def test_parse_pairwise_answer(text, verdict):
    assert parse_pairwise_answer(text) == verdict


def test_win_rates_single_order(judge):
    images, prompts, meta = batch(group("a lamp", "g0", [0.2, 0.5, 0.8]), group("a cat", "g1", [0.9, 0.1]))
    out = make(judge)(images, prompts, meta)
    assert out.scores.tolist() == pytest.approx([0.0, 0.5, 1.0, 1.0, 0.0])
    assert out.valid.all()
    # 3 + 1 unordered pairs, each requested exactly once, in one order
    assert sum(judge.attempts.values()) == 4 and set(judge.attempts.values()) == {1}
    assert out.info["num_judgements"] == 4 and out.info["num_requests"] == 4
    assert out.info["num_scored"] == 5 and out.info["num_failed"] == 0 and out.info["num_skipped"] == 0
    body = judge.bodies[0]
    assert body["model"] == "UnifiedReward" and body["temperature"] == 0.0
    parts = body["messages"][0]["content"]
    assert [p["type"] for p in parts] == ["image_url", "image_url", "text"]
    assert parts[0]["image_url"]["url"].startswith("data:image/png;base64,")
    assert "<think>" in parts[2]["text"] and "Image 1 is better" in parts[2]["text"]


def test_both_orders_cancels_position_bias(judge):
    images, prompts, meta = batch(group("biased judge", "b", [0.2, 0.5, 0.8]), group("a lamp", "g", [0.2, 0.5, 0.8]))
    out = make(judge, both_orders=True)(images, prompts, meta)
    # always "Image 1": each image is first in half of its 4 judgements -> 0.5
    assert out.scores[:3].tolist() == pytest.approx([0.5, 0.5, 0.5])
    assert out.scores[3:].tolist() == pytest.approx([0.0, 0.5, 1.0])
    assert out.info["num_position_flips"] == 3
    # every ordered pair judged exactly once
    for caption in ("biased judge", "a lamp"):
        seen = [k for k in judge.attempts if k[0] == caption]
        assert len(seen) == 6 and all(judge.attempts[k] == 1 for k in seen)
        ordered = {(b1, b2) for _, b1, b2 in seen}
        assert len(ordered) == 6 and all((b, a) in ordered for a, b in ordered)


def test_unparseable_answers_are_excluded_not_ties(judge):
    images, prompts, meta = batch(group("garbage", "x", [0.2, 0.5, 0.8]), group("partial", "y", [0.02, 0.5, 0.8]))
    out = make(judge)(images, prompts, meta)
    assert out.valid.tolist() == [False, False, False, False, True, True]
    assert out.scores.tolist() == pytest.approx([0, 0, 0, 0, 0.0, 1.0])  # image 0.02 has no judged pair
    assert out.info["num_unparseable"] == 3 + 2
    assert out.info["unparseable_samples"]


def test_server_errors_are_retried_then_bounded(judge):
    images, prompts, meta = batch(group("flaky", "f", [0.2, 0.5, 0.8]), group("down", "d", [0.2, 0.8]))
    out = make(judge, max_retries=2)(images, prompts, meta)
    assert out.scores[:3].tolist() == pytest.approx([0.0, 0.5, 1.0]) and out.valid[:3].all()
    assert not out.valid[3:].any()
    flaky = [k for k in judge.attempts if k[0] == "flaky"]
    down = [k for k in judge.attempts if k[0] == "down"]
    assert len(flaky) == 3 and all(judge.attempts[k] == 2 and judge.answered[k] == 1 for k in flaky)
    assert len(down) == 1 and judge.attempts[down[0]] == 3 and judge.answered[down[0]] == 0  # 1 + max_retries
    assert out.info["num_request_failed"] == 1 and out.info["num_retries"] == 3 + 2
    assert out.info["num_requests"] == 6 + 3


def test_timeouts_are_retried_and_requests_run_concurrently(judge):
    images, prompts, meta = group("slow", "s", [0.2, 0.5, 0.8])
    out = make(judge, timeout_s=0.5, max_retries=1)(images, prompts, meta)
    assert out.scores.tolist() == pytest.approx([0.0, 0.5, 1.0]) and out.valid.all()
    assert all(v == 2 for v in judge.attempts.values()) and len(judge.attempts) == 3
    assert judge.max_in_flight >= 2


def test_client_errors_are_not_retried(judge):
    images, prompts, meta = group("reject", "r", [0.2, 0.8])
    out = make(judge, max_retries=3)(images, prompts, meta)
    assert not out.valid.any() and sum(judge.attempts.values()) == 1
    assert "HTTP 400" in out.info["errors"][0]


def test_singletons_and_missing_group_id(judge):
    out = make(judge)([gray(0.5)], ["alone"], [{"group_id": 7}])
    assert not out.valid.any() and out.info["num_singletons"] == 1 and sum(judge.attempts.values()) == 0
    with pytest.raises(KeyError, match="group_id"):
        make(judge)([gray(0.5), gray(0.2)], ["p", "p"], [{}, {}])


def test_failed_connection_marks_invalid():
    reward = get_reward("unifiedreward_think", url="http://127.0.0.1:9", max_retries=1, backoff_s=0.01, timeout_s=2)
    images, prompts, meta = group("a lamp", "g", [0.2, 0.8])
    out = reward(images, prompts, meta)
    assert not out.valid.any() and out.info["num_request_failed"] == 1 and out.info["num_requests"] == 2
