"""geneval: GenEval's rules on constructed detections (thresholds, per-class cap, NMS, count, exclude, colour,
GenEval's position formula computed by hand), the real OWLv2 detector on a tiny random model saved with
save_pretrained (boxes checked against a hand decoding of the model outputs and a constructed case), and the CLIP
colour classifier on a tiny CLIP checked against an independent zero-shot computation."""
import math
from types import SimpleNamespace

import pytest
import torch
from PIL import Image, ImageDraw

from deepgen_rl.rewards import get_reward
from deepgen_rl.rewards.geneval import (COLOR_TEMPLATES, REFERENCE_COLORS, ClipColorClassifier, Detection,
                                       MeanColorClassifier, Owlv2Detector, evaluate, parse_geneval_prompt, relations)
from deepgen_rl.rewards.testing import build_tiny_clip, build_tiny_owlv2

BLANK = Image.new("RGB", (100, 100), "white")


def det(label, box, score=0.95):
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


def test_genevals_thresholds_cap_and_nms():
    meta = {"tag": "counting", "include": [{"class": "dog", "count": 2}]}
    low = [det("dog", (0, 0, 10, 10), 0.5), det("dog", (50, 50, 60, 60), 0.95)]
    assert evaluate(BLANK, low, meta)[0] == 0  # counting prompts: GenEval's 0.9, one dog
    assert evaluate(BLANK, low, meta, counting_threshold=0.3)[0] == 1
    single = {"tag": "single_object", "include": [{"class": "dog", "count": 1}]}
    assert evaluate(BLANK, [det("dog", (0, 0, 9, 9), 0.3)], single)[0] == 0  # score > 0.3, strictly
    assert evaluate(BLANK, [det("dog", (0, 0, 9, 9), 0.31)], single)[0] == 1
    many = {"include": [{"class": "dog", "count": 17}]}
    dogs = [det("dog", (6 * k, 0, 6 * k + 5, 5)) for k in range(17)]
    assert evaluate(BLANK, dogs, many)[0] == 0 and evaluate(BLANK, dogs, many, max_objects=17)[0] == 1
    duplicate = [det("dog", (0, 0, 10, 10), 0.9), det("dog", (1, 0, 11, 10), 0.8)]  # IoU 9/11 >= 0.5: one dog
    two = {"include": [{"class": "dog", "count": 2}]}
    assert evaluate(BLANK, duplicate, two)[0] == 0
    assert evaluate(BLANK, duplicate, two, nms_iou=1.0)[0] == 1  # GenEval's default: no NMS
    other_class = [det("dog", (0, 0, 10, 10)), det("cat", (0, 0, 10, 10))]  # NMS is per class
    both = {"include": [{"class": "dog", "count": 1}, {"class": "cat", "count": 1}]}
    assert evaluate(BLANK, other_class, both)[:2] == (2, 2)


@pytest.mark.parametrize("a, b, t, expected", [
    # o = (-20, 0), d = (20, 20): r = (-18, 0), r/|o| = (-0.9, 0)
    ((0, 0, 10, 10), (20, 0, 30, 10), 0.1, {"left of"}),
    ((20, 0, 30, 10), (0, 0, 10, 10), 0.1, {"right of"}),
    ((0, 0, 10, 10), (20, 0, 30, 10), 0.99, set()),  # r = (-0.2, 0): x = -0.01, not < -0.5
    ((0, 0, 10, 10), (20, 0, 30, 10), 1.0, set()),  # r = 0
    # o = (30, 10): r = (28, 8), |o| = 31.62 -> (0.885, 0.253): right only (not below)
    ((30, 10, 40, 20), (0, 0, 10, 10), 0.1, {"right of"}),
    # o = (40, 40): r = (38, 38) / 56.57 = (0.672, 0.672): both
    ((40, 40, 50, 50), (0, 0, 10, 10), 0.1, {"right of", "below"}),
    ((0, 0, 10, 10), (0, 40, 10, 50), 0.1, {"above"}),  # o = (0, -40): r = (0, -38) -> (0, -0.95)
    ((0, 40, 10, 50), (0, 0, 10, 10), 0.1, {"below"}),
    ((0, 0, 10, 10), (3, 1, 13, 11), 0.1, set()),  # o = (-3, -1): |o| <= t·d on both axes
])
def test_relations_are_genevals_formula(a, b, t, expected):
    assert relations(det("a", a), det("b", b), t) == expected


def test_position_needs_every_object_and_a_matched_target():
    meta = {"tag": "position", "include": [{"class": "bench", "count": 1},
                                           {"class": "dog", "count": 2, "position": ["right of", 0]}]}
    bench = det("bench", (0, 0, 20, 20), 0.99)
    right1, right2, left = det("dog", (60, 0, 80, 20)), det("dog", (60, 40, 100, 60), 0.9), det("dog", (0, 50, 5, 55))
    assert evaluate(BLANK, [bench, right1, right2], meta)[:2] == (3, 3)
    passed, checked, failures = evaluate(BLANK, [bench, right1, det("dog", (0, 40, 4, 44), 0.9)], meta)
    assert (passed, checked) == (2, 3) and failures == ["expected dog right of bench"]  # one of the 2 dogs is not
    # the bench was not found: no target, so the position fails too
    passed, checked, failures = evaluate(BLANK, [right1, right2], meta)
    assert (passed, checked) == (1, 3) and failures[-1] == "expected dog right of bench"
    # only the `count` most confident dogs are the group: a third, less confident dog on the left does not matter
    assert evaluate(BLANK, [bench, right1, right2, det("dog", left.box, 0.5)], meta)[:2] == (3, 3)
    with pytest.raises(ValueError, match="unknown relation"):
        evaluate(BLANK, [bench], {"include": [{"class": "bench", "count": 1, "position": ["inside", 0]}]})
    with pytest.raises(ValueError, match="not an earlier entry"):
        evaluate(BLANK, [bench], {"include": [{"class": "bench", "count": 1, "position": ["above", 0]}]})


def test_colour_requirement_uses_the_box_pixels():
    image = Image.new("RGB", (100, 100), "white")
    draw = ImageDraw.Draw(image)
    draw.rectangle((0, 0, 39, 39), fill=(210, 30, 30))
    draw.rectangle((60, 60, 99, 99), fill=(30, 60, 220))
    assert MeanColorClassifier().classify(image, (0, 0, 40, 40), ["red", "blue", "white"]) == "red"
    red_car = {"tag": "colors", "include": [{"class": "car", "count": 1, "color": "red"}]}
    assert evaluate(image, [det("car", (0, 0, 40, 40))], red_car)[:2] == (2, 2)
    assert evaluate(image, [det("car", (60, 60, 100, 100))], red_car)[:2] == (1, 2)
    assert evaluate(image, [], red_car)[:2] == (0, 2)  # no car: the colour fails with the count


def test_reward_strict_partial_nothing_to_score_and_batch_invariance():
    metas = [{"include": [{"class": "dog", "count": 2}]},
             {"include": [{"class": "dog", "count": 1}, {"class": "cat", "count": 1}]},
             {"prompt": "no include"},
             {"include": [{"class": "cat", "count": 1}]}]
    dets = {10: [det("dog", (0, 0, 5, 5)), det("dog", (6, 6, 9, 9))], 11: [det("dog", (0, 0, 5, 5))], 12: [],
            13: [det("cat", (0, 0, 5, 5))]}
    imgs = [Image.new("RGB", (w, 20)) for w in (10, 11, 12, 13)]
    prompts = ["", "", "not a GenEval prompt", ""]
    detector = FixedDetector(dets)
    reward = get_reward("geneval", detector=detector)
    strict = reward(imgs, prompts, metas)
    assert strict.valid.tolist() == [True, True, False, True] and strict.scores.tolist() == [1.0, 0.0, 0.0, 1.0]
    # "nothing to score" (as OCR without quoted text): no error, counted, not even detected, and wants() says so
    assert strict.info["image_errors"][2] is None and strict.info["num_skipped_no_metadata"] == 1
    assert detector.calls == 3
    assert [reward.wants(p, m) for p, m in zip(prompts, metas)] == [True, True, False, True]
    assert reward.wants("a photo of a dog", {}) and not get_reward(
        "geneval", detector=detector, parse_prompts=False).wants("a photo of a dog", {})
    partial = get_reward("geneval", detector=FixedDetector(dets), partial=True)(imgs, [""] * 4, metas)
    assert partial.scores.tolist() == [1.0, 0.5, 0.0, 1.0]
    one_by_one = torch.cat([get_reward("geneval", detector=FixedDetector(dets), partial=True)([im], [""], [m]).scores
                            for im, m in zip(imgs, metas)])
    assert torch.equal(one_by_one, partial.scores)


@pytest.mark.parametrize("bad, reason", [
    ({"include": [{"count": 1}]}, "include[0] needs a 'class' string"),
    ({"include": [{"class": "dog", "count": 0}]}, "include[0].count must be an integer >= 1"),
    ({"include": [{"class": "dog", "color": "teal"}]}, "'teal' is not one of GenEval's colours"),
    ({"include": [{"class": "dog", "position": ["above", 0]}]}, "include[0].position must be"),
    ({"include": [{"class": "dog"}], "exclude": [{"class": "dog"}]}, "exclude[0].count must be"),
])
def test_a_malformed_record_fails_its_own_image_only(bad, reason):
    dets = {10: [det("dog", (0, 0, 5, 5))], 11: [det("dog", (0, 0, 5, 5))]}
    out = get_reward("geneval", detector=FixedDetector(dets))(
        [Image.new("RGB", (w, 20)) for w in (10, 11)], ["", ""], [{"include": [{"class": "dog", "count": 1}]}, bad])
    assert out.valid.tolist() == [True, False] and out.scores.tolist() == [1.0, 0.0]
    assert reason in out.info["image_errors"][1] and out.info["num_bad_metadata"] == 1


@pytest.fixture(scope="module")
def owlv2_dir(tmp_path_factory):
    return build_tiny_owlv2(tmp_path_factory.mktemp("owlv2") / "owlv2")


def test_owlv2_detector_loads_tiny_random_model_and_scores(owlv2_dir, tmp_path):
    detector = Owlv2Detector(owlv2_dir)
    image = Image.new("RGB", (48, 32), (200, 10, 10))
    found = detector.detect(image, ["cat", "dog"])
    assert found and all(d.label in ("cat", "dog") and 0.0 <= d.score <= 1.0 and len(d.box) == 4 for d in found)
    assert found == detector.detect(image, ["cat", "dog"])  # deterministic
    reward = get_reward("geneval", detector_path=owlv2_dir, threshold=0.0, partial=True)
    imgs = [image, Image.new("RGB", (32, 32), "blue"), Image.new("RGB", (40, 40), "green")]
    metas = [{"include": [{"class": "cat", "count": 1}]}, {"include": [{"class": "dog", "count": 20}]},
             {"include": [{"class": "car", "count": 1, "color": "green"}]}]
    out = reward(imgs, [""] * 3, metas)
    assert out.valid.all() and ((out.scores >= 0) & (out.scores <= 1)).all()
    singles = torch.cat([reward([im], [""], [m]).scores for im, m in zip(imgs, metas)])
    assert torch.equal(singles, out.scores)
    with pytest.raises(OSError, match="GENEVAL_DETECTOR_PATH"):
        Owlv2Detector(str(tmp_path / "missing"))


def test_owlv2_boxes_on_a_constructed_output_are_pixels_of_the_padded_square(owlv2_dir, monkeypatch):
    """Model outputs set by hand: (cx, cy, w, h) relative to the square padded image of side max(W, H) = 48."""
    detector = Owlv2Detector(owlv2_dir)
    logits = torch.tensor([[[2.0, -1.0], [-3.0, 0.5]]])  # [1 image, 2 boxes, 2 queries (cat, dog)]
    boxes = torch.tensor([[[0.5, 0.25, 0.2, 0.1], [0.25, 0.5, 0.5, 0.5]]])
    monkeypatch.setattr(detector, "model", lambda **inputs: SimpleNamespace(logits=logits, pred_boxes=boxes))
    found = detector.detect(Image.new("RGB", (48, 32)), ["cat", "dog"])
    expected = [("cat", 1 / (1 + math.exp(-2.0)), (19.2, 9.6, 28.8, 14.4)),  # 48 · (0.4, 0.2, 0.6, 0.3)
                ("dog", 1 / (1 + math.exp(-0.5)), (0.0, 12.0, 24.0, 36.0))]  # 48 · (0, 0.25, 0.5, 0.75)
    assert [d.label for d in found] == [e[0] for e in expected]
    for d, (_, score, box) in zip(found, expected):
        assert d.score == pytest.approx(score, abs=1e-6) and d.box == pytest.approx(box, abs=1e-4)


def test_owlv2_detector_equals_a_hand_decoding_of_the_tiny_model(owlv2_dir):
    """Independent decoding: score = sigmoid(max over queries), label = argmax, box corners = (c ∓ size/2) · side;
    and the processor's padding is at the bottom (the image sits at the top-left), which makes that scaling right."""
    from transformers import Owlv2ForObjectDetection, Owlv2Processor

    detector = Owlv2Detector(owlv2_dir)
    image = Image.new("RGB", (48, 32), (200, 10, 10))
    ImageDraw.Draw(image).rectangle((30, 4, 44, 20), fill=(20, 40, 220))
    classes = ["cat", "dog", "car"]
    model = Owlv2ForObjectDetection.from_pretrained(owlv2_dir).eval()
    processor = Owlv2Processor.from_pretrained(owlv2_dir)
    inputs = processor(text=[[f"a photo of a {c}" for c in classes]], images=[image], return_tensors="pt")
    pixels = inputs["pixel_values"][0]  # [3, 32, 32]: 48x32 padded to 48x48, resized to 32x32
    mean, std = torch.tensor(processor.image_processor.image_mean), torch.tensor(processor.image_processor.image_std)
    pad = (0 - mean) / std
    assert torch.allclose(pixels[:, 23:, :], pad[:, None, None].expand(3, 9, 32), atol=1e-4)  # rows >= 32·32/48 + 1
    assert not torch.allclose(pixels[:, :20, :], pad[:, None, None].expand(3, 20, 32), atol=0.1)
    with torch.no_grad():
        out = model(**inputs)
    best = out.logits[0].max(-1)
    cx, cy, w, h = out.pred_boxes[0].unbind(-1)
    corners = torch.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], -1) * 48
    expected = sorted(zip(torch.sigmoid(best.values).tolist(), best.indices.tolist(), corners.tolist()))
    found = sorted((d.score, classes.index(d.label), list(d.box)) for d in detector.detect(image, classes))
    assert len(found) == len(expected) == out.logits.shape[1]
    for (s1, l1, b1), (s2, l2, b2) in zip(found, expected):
        assert s1 == pytest.approx(s2, abs=1e-5) and l1 == l2 and b1 == pytest.approx(b2, abs=1e-3)


def test_clip_colour_classifier_equals_an_independent_zero_shot(tmp_path):
    from transformers import AutoImageProcessor, AutoTokenizer, CLIPModel

    words = list(REFERENCE_COLORS) + ["colored", "-", "object"]
    path = build_tiny_clip(tmp_path / "clip", extra_words=words)
    classifier = ClipColorClassifier(path)
    model, tokenizer = CLIPModel.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)
    image_processor = AutoImageProcessor.from_pretrained(path)
    colors = list(REFERENCE_COLORS)

    def unit(x):
        return x / x.norm(dim=-1, keepdim=True)

    def feats(output):
        return output if isinstance(output, torch.Tensor) else output.pooler_output

    with torch.no_grad():
        weights = []
        for c in colors:
            tok = tokenizer([t.format(color=c, cls="car") for t in COLOR_TEMPLATES], padding="max_length",
                            max_length=77, return_tensors="pt")
            text = model.get_text_features(input_ids=tok["input_ids"], attention_mask=tok["attention_mask"])
            weights.append(unit(unit(feats(text)).mean(0)))
        weights = torch.stack(weights)
        image = Image.new("RGB", (64, 48), "white")
        draw = ImageDraw.Draw(image)
        boxes = [(0, 0, 30, 20), (30, 10, 64, 48), (5, 25, 40, 45), (0, 0, 64, 48)]
        for k, box in enumerate(boxes):
            draw.rectangle(box, fill=tuple(REFERENCE_COLORS[colors[3 * k % 10]]))
        expected, all_logits = [], []
        for x0, y0, x1, y1 in boxes:
            pixels = image_processor(images=[image.crop((x0, y0, x1, y1))], return_tensors="pt")["pixel_values"]
            logits = unit(feats(model.get_image_features(pixel_values=pixels))) @ weights.T
            all_logits.append(logits)
            expected.append(colors[int(logits.argmax())])
    assert torch.cat(all_logits).std() > 1e-4  # the templates and crops give distinct scores: a real choice
    assert [classifier.classify(image, box, colors, "car") for box in boxes] == expected
    reward = get_reward("geneval", detector=FixedDetector({64: [det("car", boxes[1])]}), color_model_name_or_path=path)
    assert isinstance(reward.colors, ClipColorClassifier)
    for color in colors:
        meta = {"include": [{"class": "car", "count": 1, "color": color}]}
        assert bool(reward([image], [""], [meta]).scores[0]) == (color == expected[1])


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
