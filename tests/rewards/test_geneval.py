"""geneval: the rules on constructed detections (presence, count, exclude, colour, position, NMS, thresholds), and
the real OWLv2 detector on a tiny random model saved with save_pretrained and loaded back."""
import pytest
import torch
from PIL import Image, ImageDraw

from deepgen_rl.rewards import get_reward
from deepgen_rl.rewards.geneval import (Detection, MeanColorClassifier, Owlv2Detector, evaluate,
                                       parse_geneval_prompt, relations)
from deepgen_rl.rewards.testing import build_tiny_owlv2

BLANK = Image.new("RGB", (100, 100), "white")


def det(label, box, score=0.9):
    return Detection(label, score, box)


class FixedDetector:
    """Returns the detections given per image (keyed by the image's width)."""

    def __init__(self, by_width):
        self.by_width, self.calls = by_width, 0

    def detect(self, image, classes):
        self.calls += 1
        return [d for d in self.by_width[image.size[0]] if d.label in classes]


def test_presence_count_and_exclude():
    dogs = [det("dog", (0, 0, 10, 10)), det("dog", (50, 50, 60, 60))]
    two = {"tag": "counting", "include": [{"class": "dog", "count": 2}], "exclude": [{"class": "dog", "count": 3}]}
    assert evaluate(BLANK, dogs, two) == (2, 2, [])
    passed, checked, failures = evaluate(BLANK, dogs + [det("dog", (80, 0, 90, 10))], two)
    assert (passed, checked) == (1, 2) and "expected < 3 dog, found 3" in failures
    passed, checked, failures = evaluate(BLANK, dogs[:1], two)
    assert (passed, checked) == (1, 2) and "expected >= 2 dog, found 1" in failures
    assert evaluate(BLANK, [], {"include": [{"class": "cat", "count": 1}]})[:2] == (0, 1)


def test_thresholds_and_nms():
    meta = {"tag": "counting", "include": [{"class": "dog", "count": 2}]}
    low = [det("dog", (0, 0, 10, 10), 0.5), det("dog", (50, 50, 60, 60), 0.95)]
    assert evaluate(BLANK, low, meta, threshold=0.3)[0] == 1
    assert evaluate(BLANK, low, meta, threshold=0.3, counting_threshold=0.9)[0] == 0  # only one dog >= 0.9
    duplicate = [det("dog", (0, 0, 10, 10), 0.9), det("dog", (1, 0, 11, 10), 0.8)]  # IoU 9/11 > 0.5: one dog
    assert evaluate(BLANK, duplicate, meta)[0] == 0
    assert evaluate(BLANK, duplicate, meta, nms_iou=0.95)[0] == 1
    other_class = [det("dog", (0, 0, 10, 10)), det("cat", (0, 0, 10, 10))]  # NMS is per class
    both = {"include": [{"class": "dog", "count": 1}, {"class": "cat", "count": 1}]}
    assert evaluate(BLANK, other_class, both)[:2] == (2, 2)


def test_relations_formula():
    a, b = det("a", (0, 0, 10, 10)), det("b", (20, 0, 30, 10))  # centres 5 and 25, widths 10 + 10
    assert relations(a, b, 0.1) == {"left of"} and relations(b, a, 0.1) == {"right of"}
    assert relations(a, b, 0.99) == {"left of"} and relations(a, b, 1.0) == set()  # |o| = 20 must exceed t·20
    top, bottom = det("t", (0, 0, 10, 10)), det("u", (0, 40, 10, 50))
    assert relations(top, bottom, 0.1) == {"above"} and relations(bottom, top, 0.1) == {"below"}


def test_position_requirement():
    meta = {"tag": "position", "include": [{"class": "bench", "count": 1},
                                           {"class": "dog", "count": 1, "position": ["right of", 0]}]}
    bench, dog_right, dog_left = det("bench", (0, 0, 20, 20)), det("dog", (60, 0, 80, 20)), det("dog", (0, 50, 5, 55))
    assert evaluate(BLANK, [bench, dog_right], meta)[:2] == (3, 3)
    passed, checked, failures = evaluate(BLANK, [bench, dog_left], meta)
    assert (passed, checked) == (2, 3) and failures == ["expected dog right of bench"]
    with pytest.raises(ValueError, match="unknown relation"):
        evaluate(BLANK, [bench], {"include": [{"class": "bench", "count": 1, "position": ["inside", 0]}]})


def test_colour_requirement_uses_the_box_pixels():
    image = Image.new("RGB", (100, 100), "white")
    draw = ImageDraw.Draw(image)
    draw.rectangle((0, 0, 39, 39), fill=(210, 30, 30))
    draw.rectangle((60, 60, 99, 99), fill=(30, 60, 220))
    assert MeanColorClassifier().classify(image, (0, 0, 40, 40), ["red", "blue", "white"]) == "red"
    red_car = {"tag": "colors", "include": [{"class": "car", "count": 1, "color": "red"}]}
    assert evaluate(image, [det("car", (0, 0, 40, 40))], red_car)[:2] == (2, 2)
    assert evaluate(image, [det("car", (60, 60, 100, 100))], red_car)[:2] == (1, 2)


def test_reward_strict_partial_invalid_and_batch_invariance():
    metas = [{"include": [{"class": "dog", "count": 2}]},
             {"include": [{"class": "dog", "count": 1}, {"class": "cat", "count": 1}]},
             {"prompt": "no include"},
             {"include": [{"class": "cat", "count": 1}]}]
    dets = {10: [det("dog", (0, 0, 5, 5)), det("dog", (6, 6, 9, 9))], 11: [det("dog", (0, 0, 5, 5))], 12: [],
            13: [det("cat", (0, 0, 5, 5))]}
    imgs = [Image.new("RGB", (w, 20)) for w in (10, 11, 12, 13)]
    strict = get_reward("geneval", detector=FixedDetector(dets))(imgs, ["", "", "not a GenEval prompt", ""], metas)
    assert strict.valid.tolist() == [True, True, False, True] and strict.scores.tolist() == [1.0, 0.0, 0.0, 1.0]
    assert "no GenEval 'include'" in strict.info["image_errors"][2]
    partial = get_reward("geneval", detector=FixedDetector(dets), partial=True)(imgs, [""] * 4, metas)
    assert partial.scores.tolist() == [1.0, 0.5, 0.0, 1.0]
    one_by_one = torch.cat([get_reward("geneval", detector=FixedDetector(dets), partial=True)([im], [""], [m]).scores
                            for im, m in zip(imgs, metas)])
    assert torch.equal(one_by_one, partial.scores)


def test_owlv2_detector_loads_tiny_random_model_and_scores(tmp_path):
    path = build_tiny_owlv2(tmp_path / "owlv2")
    detector = Owlv2Detector(path)
    image = Image.new("RGB", (48, 32), (200, 10, 10))
    found = detector.detect(image, ["cat", "dog"])
    assert found and all(d.label in ("cat", "dog") and 0.0 <= d.score <= 1.0 and len(d.box) == 4 for d in found)
    assert found == detector.detect(image, ["cat", "dog"])  # deterministic
    reward = get_reward("geneval", detector_path=path, threshold=0.0, partial=True)
    imgs = [image, Image.new("RGB", (32, 32), "blue"), Image.new("RGB", (40, 40), "green")]
    metas = [{"include": [{"class": "cat", "count": 1}]}, {"include": [{"class": "dog", "count": 20}]},
             {"include": [{"class": "car", "count": 1, "color": "green"}]}]
    out = reward(imgs, [""] * 3, metas)
    assert out.valid.all() and ((out.scores >= 0) & (out.scores <= 1)).all()
    singles = torch.cat([reward([im], [""], [m]).scores for im, m in zip(imgs, metas)])
    assert torch.equal(singles, out.scores)
    with pytest.raises(OSError, match="GENEVAL_DETECTOR_PATH"):
        Owlv2Detector(str(tmp_path / "missing"))


@pytest.mark.parametrize("prompt, expected", [
    ("a photo of a bench", {"tag": "single_object", "include": [{"class": "bench", "count": 1}]}),
    ("a photo of an orange traffic light.", {"tag": "colors",
                                            "include": [{"class": "traffic light", "count": 1, "color": "orange"}]}),
    ("a photo of a dog and a cell phone", {"tag": "two_object", "include": [{"class": "dog", "count": 1},
                                                                            {"class": "cell phone", "count": 1}]}),
    ("a photo of a red cup and a blue car", {"tag": "color_attr", "include": [
        {"class": "cup", "count": 1, "color": "red"}, {"class": "car", "count": 1, "color": "blue"}]}),
    ("a photo of three apples", {"tag": "counting", "include": [{"class": "apples", "count": 3}],
                                 "exclude": [{"class": "apples", "count": 4}]}),
    ("a photo of a dog right of a teddy bear", {"tag": "position", "include": [
        {"class": "teddy bear", "count": 1}, {"class": "dog", "count": 1, "position": ["right of", 0]}]}),
    ("A cat sitting on a sofa", None),
])
def test_geneval_prompt_templates(prompt, expected):
    assert parse_geneval_prompt(prompt) == expected


def test_prompt_fallback_scores_without_metadata():
    dets = {10: [det("dog", (60, 0, 80, 20)), det("teddy bear", (0, 0, 20, 20))], 11: [det("dog", (0, 0, 20, 20))]}
    imgs = [Image.new("RGB", (w, 20)) for w in (10, 11)]
    prompts = ["a photo of a dog right of a teddy bear", "a photo of two dogs"]
    out = get_reward("geneval", detector=FixedDetector({10: dets[10], 11: [det("dogs", (0, 0, 5, 5))]}))(
        imgs, prompts, [{}, {}])
    assert out.valid.all() and out.scores.tolist() == [1.0, 0.0]
    off = get_reward("geneval", detector=FixedDetector(dets), parse_prompts=False)(imgs, prompts, [{}, {}])
    assert not off.valid.any()
