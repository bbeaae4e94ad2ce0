"""Registry, RewardOutput contract and the programmatic rewards (brightness, color_target, jpeg_*)."""
import io
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
from PIL import Image

from deepgen_rl.rewards import Reward, RewardOutput, available_rewards, get_reward, register_reward


def solid(rgb, size=(16, 16)):
    return Image.new("RGB", size, rgb)


def test_registry_has_all_names():
    assert set(available_rewards()) >= {
        "ocr", "unifiedreward_think", "clip_sim", "jpeg_compressibility", "jpeg_incompressibility", "brightness",
        "color_target",
    }
    with pytest.raises(KeyError, match="available"):
        get_reward("no_such_reward")


def test_register_reward_one_decorator_line():
    @register_reward("test_constant")
    class Constant(Reward):
        def __init__(self, value=0.25):
            self.value = value

        def score(self, images, prompts, metadata):
            return torch.full((len(images),), self.value), torch.ones(len(images), dtype=torch.bool), {"extra": 1}

    out = get_reward("test_constant", value=0.75)([solid((0, 0, 0))] * 3, ["a"] * 3, [{}] * 3)
    assert out.scores.tolist() == [0.75] * 3 and out.scores.dtype == torch.float32 and out.valid.dtype == torch.bool
    assert {"latency_s", "num_scored", "num_failed", "num_skipped", "extra"} <= out.info.keys()
    assert out.info["num_scored"] == 3 and out.info["num_failed"] == 0 and out.info["num_skipped"] == 0


def test_nonfinite_scores_become_invalid():
    class Broken(Reward):
        def score(self, images, prompts, metadata):
            return torch.tensor([1.0, float("nan")]), torch.ones(2, dtype=torch.bool), {}

    out = Broken()([solid((0, 0, 0))] * 2, ["a", "b"], [{}, {}])
    assert out.valid.tolist() == [True, False] and out.scores.tolist() == [1.0, 0.0]
    assert out.info["num_nonfinite"] == 1 and out.info["num_failed"] == 1


def test_reward_output_zeroes_invalid_placeholders():
    out = RewardOutput(torch.tensor([0.3, 0.9]), torch.tensor([True, False]))
    assert out.scores.tolist() == pytest.approx([0.3, 0.0])


def test_length_mismatch_raises():
    with pytest.raises(ValueError):
        get_reward("brightness")([solid((0, 0, 0))], ["a", "b"], [{}])


def test_brightness():
    out = get_reward("brightness")([solid((0, 0, 0)), solid((255, 255, 255)), solid((255, 0, 0))], ["", "", ""], [{}] * 3)
    assert out.scores.tolist() == pytest.approx([0.0, 1.0, 1 / 3])


def test_color_target_default_red_and_custom():
    images = [solid((255, 0, 0)), solid((0, 0, 255)), solid((0, 0, 0))]
    assert get_reward("color_target")(images, [""] * 3, [{}] * 3).scores.tolist() == pytest.approx([1.0, 1 / 3, 2 / 3])
    blue = get_reward("color_target", target=(0, 0, 1))(images, [""] * 3, [{}] * 3)
    assert blue.scores.tolist() == pytest.approx([1 / 3, 1.0, 2 / 3])
    with pytest.raises(ValueError):
        get_reward("color_target", target=(2, 0, 0))


def test_jpeg_rewards_are_signed_kilobytes_at_quality_95():
    rng = np.random.default_rng(0)
    noise = Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8))
    flat = solid((128, 128, 128), (64, 64))
    buffer = io.BytesIO()
    noise.save(buffer, format="JPEG", quality=95)
    expected_kb = buffer.tell() / 1000
    inc = get_reward("jpeg_incompressibility")([noise, flat], ["", ""], [{}, {}])
    comp = get_reward("jpeg_compressibility")([noise, flat], ["", ""], [{}, {}])
    assert inc.scores[0].item() == pytest.approx(expected_kb, rel=1e-6)
    assert comp.scores.tolist() == pytest.approx((-inc.scores).tolist())
    assert comp.scores[1] > comp.scores[0]  # the flat image compresses better


def test_rewards_are_thread_safe():
    images = [solid((i * 10, 0, 0)) for i in range(20)]
    reward = get_reward("color_target")
    serial = reward(images, [""] * 20, [{}] * 20).scores
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _: reward(images, [""] * 20, [{}] * 20).scores, range(16)))
    assert all(torch.equal(r, serial) for r in results)
