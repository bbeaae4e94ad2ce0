"""ocr_vlm and pointwise unifiedreward against a local fake OpenAI-compatible VLM server."""
import pytest
import torch
from PIL import Image

from deepgen_rl.rewards import get_reward
from deepgen_rl.rewards.unifiedreward_pointwise import parse_pointwise_answer
from deepgen_rl.services.ocr.scoring import ocr_score

from fake_vlm_server import FakeVlm, grey_level

RED, BLUE, GREEN = (200, 0, 0), (0, 0, 200), (0, 150, 0)


def solid(rgb, size=(24, 24)):
    return Image.new("RGB", size, rgb)


def test_ocr_vlm_scores_like_ocr_and_skips_prompts_without_text():
    with FakeVlm({RED: "Hello World", BLUE: "Helo Wrld", GREEN: "NONE"}) as vlm:
        reward = get_reward("ocr_vlm", url=vlm.url, workers=4)
        prompts = ['a sign "Hello World"', 'a sign "Hello World"', 'a sign "Hello World"', "a sign without text"]
        out = reward([solid(RED), solid(BLUE), solid(GREEN), solid(RED)], prompts)
        assert out.valid.tolist() == [True, True, True, False]
        expected = [ocr_score(prompts[0], "Hello World"), ocr_score(prompts[0], "Helo Wrld"), 0.0]
        assert out.scores[:3].tolist() == pytest.approx(expected)
        assert expected[1] == pytest.approx(1 - 2 / 10)  # two deletions over 10 target characters
        assert out.info["num_skipped_no_target"] == 1 and out.info["image_errors"][3] is None
        assert sum(vlm.attempts.values()) == 3  # no request for the prompt without quoted text
        assert out.info["texts"][:3] == ["Hello World", "Helo Wrld", ""]
        singles = torch.cat([reward([im], [p]).scores for im, p in
                             zip([solid(RED), solid(BLUE), solid(GREEN), solid(RED)], prompts)])
        assert torch.equal(singles, out.scores)


def test_unifiedreward_formula_failures_and_batch_invariance():
    greys = [0, 64, 128, 255]
    imgs = [solid((g, g, g)) for g in greys]
    with FakeVlm() as vlm:
        reward = get_reward("unifiedreward", url=vlm.url, max_retries=1, backoff_s=0.01, workers=3)
        out = reward(imgs, [f"caption {g}" for g in greys])
        assert out.valid.all()
        for i, image in enumerate(imgs):
            a, s = 1 + 4 * grey_level(image), 3.0
            assert out.scores[i].item() == pytest.approx(0.5 * (a - 1) / 4 + 0.5 * (s - 1) / 4, abs=1e-6)
            assert out.info["alignment"][i] == pytest.approx(a) and out.info["style"][i] == 3.0
        singles = torch.cat([reward([im], [f"caption {g}"]).scores for im, g in zip(imgs, greys)])
        assert torch.equal(singles, out.scores)
        weighted = get_reward("unifiedreward", url=vlm.url, alignment_weight=1.0)(imgs[3:], ["caption 255"])
        assert weighted.scores.item() == pytest.approx(1.0)
        bad = reward([solid((10, 10, 10))] * 4, ["garbage", "down", "flaky one", "outofrange"])
        assert bad.valid.tolist() == [False, False, True, False]
        assert bad.info["num_unparseable"] == 2 and bad.info["num_request_failed"] == 1
        assert bad.info["num_retries"] >= 2 and "request failed" in bad.info["image_errors"][1]
        assert (bad.scores[~bad.valid] == 0).all()


def test_unreachable_endpoint_is_invalid_not_scored():
    for name in ("unifiedreward", "ocr_vlm"):
        out = get_reward(name, url="http://127.0.0.1:9", max_retries=1, backoff_s=0.01, timeout_s=2)(
            [solid(RED)] * 2, ['"x"'] * 2)
        assert not out.valid.any() and out.info["num_request_failed"] == 2


@pytest.mark.parametrize("text, expected", [
    ("Alignment Score: 4\nStyle Score: 2.5", (4.0, 2.5)),
    ("<think>Alignment Score: 1</think> alignment score: **5**\nSTYLE SCORE: 5", (5.0, 5.0)),
    ("Alignment Score: 4", None), ("Alignment Score: 0\nStyle Score: 3", None), ("", None), (None, None),
])
def test_parse_pointwise_answer(text, expected):
    assert parse_pointwise_answer(text) == expected
