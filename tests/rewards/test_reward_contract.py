"""The Reward contract, checked on EVERY registered reward (``available_rewards()``), as diffusers' SchedulerCommonTest
is inherited by every scheduler: a new reward is tested by adding one entry to ``FIXTURES`` (a registered reward
without one fails with "add a fixture for 'x'").

Each fixture builds the reward on tiny local models / services (no hub) and returns a :class:`Case`: inputs on which
the reward gives at least one valid score, and ``unit``, the number of consecutive samples scored together (1 for
pointwise rewards; the group size for a groupwise judge, which compares the images of one prompt).

Contract: scores (N,) fp32 and valid (N,) bool; info has latency_s / num_scored / num_failed / num_skipped that agree
with ``valid``; a length mismatch raises ValueError; a NaN score becomes valid=False with score 0 (never a number);
four threads calling at once get the sequential result; scoring the batch at once equals scoring it unit by unit.
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest
import torch
from PIL import Image

from deepgen_rl.rewards import available_rewards, get_reward
from deepgen_rl.rewards.base import Reward

ATOL = 1e-5  # batched vs one-at-a-time model forwards (fp32, CPU)


@dataclass
class Case:
    reward: Reward
    images: list
    prompts: list[str]
    metadata: list[dict]
    unit: int = 1


def colours(n, size=(32, 32)):
    return [Image.new("RGB", (size[0] + 2 * i, size[1]), ((50 * i) % 256, 200 - 30 * i, 90 + 20 * i)) for i in range(n)]


PROMPTS = ["a photo of a cat", "a red car", "a dog left of a bench", "green sign"]


def _plain(name, **kw):
    return lambda tmp: Case(get_reward(name, **kw), colours(4), PROMPTS, [{}] * 4)


def _clip(name):
    def make(tmp):
        from deepgen_rl.rewards.testing import build_tiny_clip

        return Case(get_reward(name, model_name_or_path=build_tiny_clip(tmp / "clip"), batch_size=3), colours(4),
                    PROMPTS, [{}] * 4)
    return make


def _aesthetic(tmp):
    from deepgen_rl.rewards.testing import build_aesthetic_head, build_tiny_clip

    clip = build_tiny_clip(tmp / "clip")
    head = build_aesthetic_head(tmp / "head.pth", input_size=16)
    return Case(get_reward("aesthetic", model_name_or_path=clip, head_path=head), colours(4), PROMPTS, [{}] * 4)


def _hpsv2(tmp):
    from deepgen_rl.rewards.testing import build_tiny_hpsv2

    return Case(get_reward("hpsv2", batch_size=3, **build_tiny_hpsv2(tmp)), colours(4), PROMPTS, [{}] * 4)


def _imagereward(tmp):
    from deepgen_rl.rewards.testing import build_tiny_imagereward

    return Case(get_reward("imagereward", batch_size=3, **build_tiny_imagereward(tmp)), colours(4), PROMPTS,
                [{}] * 4)


def _geneval(tmp):
    from deepgen_rl.rewards.testing import build_tiny_owlv2

    metas = [{"include": [{"class": "cat", "count": 1}]}, {"include": [{"class": "dog", "count": 2}]},
             {"include": [{"class": "car", "count": 1, "color": "green"}]}, {"include": [{"class": "cat", "count": 1}]},
             {}]  # the last: no metadata, no GenEval template -- nothing to score
    reward = get_reward("geneval", detector_path=build_tiny_owlv2(tmp / "owlv2"), threshold=0.0, partial=True)
    return Case(reward, colours(5, (48, 32)), [""] * 4 + ["a cat on a sofa"], metas)


def _ocr_images():
    from deepgen_rl.services.ocr.launch import render_text_image

    return [render_text_image("Hello World"), render_text_image("DeepGen"), render_text_image("Hello World"),
            render_text_image("no text wanted")], ['"Hello World"', 'logo "DeepGen"', '"Zebra"', "a plain prompt"]


def _ocr_local(tmp):
    images, prompts = _ocr_images()
    return Case(get_reward("ocr_local"), images, prompts, [{}] * 4)


def _ocr(tmp, request):
    from deepgen_rl.services.ocr.launch import OcrServiceProcess

    svc = OcrServiceProcess(env={"OCR_THREADS": "2", "OCR_ORT_THREADS": "1", "REWARD_API_TOKEN": ""}).__enter__()
    request.addfinalizer(lambda: svc.__exit__(None, None, None))
    images, prompts = _ocr_images()
    return Case(get_reward("ocr", url=svc.url, batch_size=2), images, prompts, [{}] * 4)


def _remote(tmp, request):
    from deepgen_rl.services.reward.launch import RewardServerProcess

    server = RewardServerProcess(["brightness"], env={"REWARD_API_TOKEN": ""}).__enter__()
    request.addfinalizer(lambda: server.__exit__(None, None, None))
    return Case(get_reward("remote", url=server.url, name="brightness", batch_size=2), colours(4), PROMPTS, [{}] * 4)


def _vlm(name):
    def make(tmp, request):
        from fake_vlm_server import FakeVlm

        vlm = FakeVlm({(200, 0, 0): "Hello World", (0, 0, 200): "Helo Wrld"}).__enter__()
        request.addfinalizer(lambda: vlm.__exit__(None, None, None))
        images = [Image.new("RGB", (24, 24), c) for c in ((200, 0, 0), (0, 0, 200), (0, 150, 0), (64, 64, 64))]
        prompts = ['a sign "Hello World"'] * 3 + ["caption 64"]
        return Case(get_reward(name, url=vlm.url, max_retries=1, backoff_s=0.01, workers=3), images, prompts,
                    [{}] * 4)
    return make


def _unifiedreward_think(tmp, request):
    from fake_judge_server import FakeJudge

    judge = FakeJudge().__enter__()
    request.addfinalizer(lambda: judge.__exit__(None, None, None))
    levels = [0.2, 0.5, 0.8, 0.9, 0.1, 0.4]
    images = [Image.new("RGB", (32, 32), (round(v * 255),) * 3) for v in levels]
    metas = [{"group_id": g} for g in ("g0", "g0", "g0", "g1", "g1", "g1")]
    return Case(get_reward("unifiedreward_think", url=judge.url, backoff_s=0.01), images,
                ["a lamp"] * 3 + ["a cat"] * 3, metas, unit=3)


def _toy_compositional(tmp):
    from deepgen_rl.toy.world import caption, render_spec, sample_specs

    specs = sample_specs("train", 3, seed=0)
    images = [render_spec(sp, seed=i) for i, sp in enumerate(specs)] + [render_spec(specs[0], seed=9)]
    prompts = [caption(sp) for sp in specs] + ["a photo of a cat"]  # the last is not a toy caption: invalid
    return Case(get_reward("toy_compositional"), images, prompts, [{}] * 4)


FIXTURES = {
    "brightness": _plain("brightness"),
    "color_target": _plain("color_target"),
    "jpeg_compressibility": _plain("jpeg_compressibility"),
    "jpeg_incompressibility": _plain("jpeg_incompressibility"),
    "clip_sim": _clip("clip_sim"),
    "pickscore": _clip("pickscore"),
    "aesthetic": _aesthetic,
    "hpsv2": _hpsv2,
    "imagereward": _imagereward,
    "geneval": _geneval,
    "ocr_local": _ocr_local,
    "ocr": _ocr,
    "remote": _remote,
    "ocr_vlm": _vlm("ocr_vlm"),
    "unifiedreward": _vlm("unifiedreward"),
    "unifiedreward_think": _unifiedreward_think,
    "toy_compositional": _toy_compositional,
}
NEEDS_REQUEST = {"ocr", "remote", "ocr_vlm", "unifiedreward", "unifiedreward_think"}
SKIPS_IN_FIXTURE = {"geneval", "ocr_local", "ocr_vlm"}  # rewards whose fixture holds a sample wants() refuses


@pytest.fixture(scope="module", params=available_rewards())
def case(request, tmp_path_factory):
    name = request.param
    if name not in FIXTURES:
        pytest.fail(f"add a fixture for {name!r} to FIXTURES in tests/rewards/test_reward_contract.py")
    tmp = tmp_path_factory.mktemp(name)
    return FIXTURES[name](tmp, request) if name in NEEDS_REQUEST else FIXTURES[name](tmp)


def test_scores_and_valid_have_the_contract_dtypes_and_info(case):
    out = case.reward(case.images, case.prompts, case.metadata)
    n = len(case.images)
    assert out.scores.dtype == torch.float32 and tuple(out.scores.shape) == (n,)
    assert out.valid.dtype == torch.bool and tuple(out.valid.shape) == (n,)
    assert out.valid.any(), "the fixture must give at least one valid score"
    assert torch.isfinite(out.scores).all() and (out.scores[~out.valid] == 0).all()
    assert {"latency_s", "num_scored", "num_failed", "num_skipped"} <= set(out.info)
    assert out.info["num_scored"] == int(out.valid.sum()) and out.info["num_failed"] == int((~out.valid).sum())
    assert out.info["latency_s"] >= 0 and math.isfinite(out.info["latency_s"])


def test_a_length_mismatch_is_refused(case):
    with pytest.raises(ValueError):
        case.reward(case.images, case.prompts[:-1], case.metadata)


def test_a_nan_score_becomes_invalid_never_a_number(case, monkeypatch):
    reward = case.reward
    real = type(reward).score

    def nan_first(self, images, prompts, metadata):
        scores, valid, info = real(self, images, prompts, metadata)
        scores = torch.as_tensor(scores, dtype=torch.float32).clone()
        scores[0] = float("nan")
        return scores, torch.as_tensor(valid, dtype=torch.bool).clone() | True, info

    monkeypatch.setattr(type(reward), "score", nan_first)
    out = reward(case.images, case.prompts, case.metadata)
    assert not bool(out.valid[0]) and out.scores[0].item() == 0.0
    assert out.info["num_nonfinite"] == 1 and torch.isfinite(out.scores).all()


def test_four_threads_at_once_get_the_sequential_result(case):
    expected = case.reward(case.images, case.prompts, case.metadata)
    with ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(lambda _: case.reward(case.images, case.prompts, case.metadata), range(4)))
    for out in outs:
        assert torch.equal(out.valid, expected.valid)
        torch.testing.assert_close(out.scores, expected.scores, atol=ATOL, rtol=0)


def test_scores_do_not_depend_on_the_batch(case):
    whole = case.reward(case.images, case.prompts, case.metadata)
    parts = [case.reward(case.images[s:s + case.unit], case.prompts[s:s + case.unit], case.metadata[s:s + case.unit])
             for s in range(0, len(case.images), case.unit)]
    assert torch.equal(torch.cat([p.valid for p in parts]), whole.valid)
    torch.testing.assert_close(torch.cat([p.scores for p in parts]), whole.scores, atol=ATOL, rtol=0)


def test_a_sample_the_reward_does_not_want_is_invalid_without_an_error(case, request):
    """What lets the reward server skip decoding such images: wants() False => valid=False and no image error."""
    wanted = [case.reward.wants(p, m) for p, m in zip(case.prompts, case.metadata)]
    if request.node.callspec.params["case"] in SKIPS_IN_FIXTURE:
        assert not all(wanted), "this fixture holds a sample with nothing to score"
    out = case.reward(case.images, case.prompts, case.metadata)
    errors = out.info.get("image_errors") or [None] * len(wanted)
    for i, want in enumerate(wanted):
        if not want:
            assert not bool(out.valid[i]) and errors[i] is None, i
