"""The toy world's grammar, splits and renderer, and the programmatic checker's accuracy (clean, blurred, noisy)."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from PIL import Image, ImageFilter

from deepgen_rl.toy.checker import CLAIM_TYPES, check, find_blobs
from deepgen_rl.toy.world import (COLORS, HELD_OUT_PAIRS, KINDS, SHAPES, CaptionError, ObjectSpec, Placed, Spec,
                                  all_specs, caption, layout, parse_caption, render, render_spec, sample_pairs,
                                  sample_specs, slot_layout, split_specs)


def test_every_caption_parses_back_to_its_spec():
    specs = all_specs()
    assert len(specs) == 18 + 36 + 72 + 4 * 18 * 15
    assert len({caption(s) for s in specs}) == len(specs)
    for s in specs:
        assert parse_caption(caption(s)) == s and parse_caption(caption(s)).kind == s.kind
    assert parse_caption("  Two Red Circles. ") == Spec((ObjectSpec("red", "circle", 2),), None)


@pytest.mark.parametrize("text", ["a red apple", "two red circle", "a red circles", "a red circle left of a red square",
                                  "two red circles on the left", "a purple circle", ""])
def test_non_captions_raise_naming_the_text(text):
    with pytest.raises(CaptionError, match="toy"):
        parse_caption(text)


def test_splits_hold_out_colour_shape_pairs():
    train, held = split_specs("train"), split_specs("held_out")
    assert len(train) + len(held) == len(all_specs())
    assert not any(s.pairs() & HELD_OUT_PAIRS for s in train)
    assert all(s.pairs() & HELD_OUT_PAIRS for s in held)
    # every colour and every shape still occurs in training (held-out = new compositions of known words)
    seen = {p for s in train for p in s.pairs()}
    assert {c for c, _ in seen} == set(COLORS) and {sh for _, sh in seen} == set(SHAPES)
    for kind in KINDS:
        assert any(s.kind == kind for s in held)
    a, b = sample_specs("held_out", 40, seed=1), sample_specs("held_out", 40, seed=1)
    assert a == b and len(set(a)) == 40 and all(s.held_out for s in a)


def test_committed_prompt_files_are_the_generators_and_rl_never_sees_an_eval_caption():
    """assets/rl_datasets/toy/* equal ``python -m deepgen_rl.toy.datasets``'s output; the RL prompt files hold no
    held-out eval caption; the held-out RL relations all carry a held-out colour-shape pair and the count / region
    mixture none (it is train-split, so it may share captions with eval/train.jsonl, the pre-training check)."""
    import json

    from deepgen_rl.toy.datasets import ROOT, files

    generated = files()
    assert sorted(generated) == sorted(str(p.relative_to(ROOT)) for p in ROOT.rglob("*.jsonl"))
    for rel, text in generated.items():
        assert (ROOT / rel).read_text(encoding="utf-8") == text, rel

    def specs(rel):
        return [parse_caption(json.loads(line)["prompt"]) for line in generated[rel].splitlines()]

    held = set(specs("eval/heldout.jsonl"))
    rl, mix = specs("rl_prompts.jsonl"), specs("rl_train_count_region.jsonl")
    assert len(held) == 64 and not held & (set(rl) | set(mix))
    assert set(rl) | held == set(split_specs("held_out"))
    assert all(s.kind == "relation" and s.pairs() & HELD_OUT_PAIRS for s in rl) and len(rl) == 396
    assert {s.kind for s in mix} == {"count", "region"} and not any(s.pairs() & HELD_OUT_PAIRS for s in mix)
    assert len(mix) == sum(s.kind in ("count", "region") for s in split_specs("train"))
    # the headline run's mixture reads both files: 3/4 of the prompts from the held-out relations, 1/4 from the mix
    from deepgen_rl.data.prompts import load_train_config

    cfg = load_train_config(ROOT / "toy_rl_mix.yaml")
    assert [(len(d), d.reward_weights) for d in cfg.datasets] == [(396, {"toy_compositional": 1.0}),
                                                                 (len(mix), {"toy_compositional": 1.0})]
    assert cfg.dataset_probabilities().tolist() == [0.75, 0.25]


def test_render_is_deterministic_and_layout_honours_positions():
    spec = parse_caption("a red circle left of a blue square")
    assert np.array_equal(np.asarray(render_spec(spec, 3)), np.asarray(render_spec(spec, 3)))
    rng = random.Random(0)
    for _ in range(50):
        a, b = layout(spec, rng)
        assert a.cx + 12 <= b.cx
        left = layout(parse_caption("a green square on the left"), rng)[0]
        assert left.cx < 32 - 6


def test_slot_layout_satisfies_every_spec_and_depends_only_on_its_structure():
    """Every caption of the grammar, drawn by ``slot_layout`` at the largest sizes and jitter it allows, passes the
    checker; objects never touch (boxes ≥ 1 px apart); without jitter two captions of the same structure get the
    same centres; bad options are clear errors."""
    rng = random.Random(0)
    specs = all_specs()
    images, caps = [], []
    for spec in specs:
        placed = slot_layout(spec, rng, sizes=(25.0, 26.0), jitter=2.0)
        assert [(p.color, p.shape) for p in placed] == [(o.color, o.shape) for o in spec.objects for _ in
                                                         range(o.count)]
        for i, p in enumerate(placed):
            assert 1 <= p.cx - p.size / 2 and p.cx + p.size / 2 <= 63 and 1 <= p.cy - p.size / 2
            assert p.cy + p.size / 2 <= 63
            for q in placed[:i]:
                assert max(abs(p.cx - q.cx), abs(p.cy - q.cy)) >= (p.size + q.size) / 2 + 1
        images.append(render(placed))
        caps.append(caption(spec))
    verdicts = [check(im, c) for im, c in zip(images, caps)]
    assert sum(v.strict for v in verdicts) >= 0.99 * len(specs)
    centres = lambda text: [(p.cx, p.cy) for p in slot_layout(parse_caption(text), rng, jitter=0.0)]
    assert centres("a red circle above a blue square") == centres("a green triangle above a cyan circle")
    assert centres("three red circles") == centres("three blue triangles") != centres("two blue triangles")
    assert centres("a red circle on the left")[0][0] < 32 < centres("a red circle on the right")[0][0]
    a = sample_pairs("train", 6, random.Random(4), (22.0, 26.0), layout_mode="slots")
    b = sample_pairs("train", 6, random.Random(4), (22.0, 26.0), layout_mode="slots")
    assert [t for t, _ in a] == [t for t, _ in b]
    assert all(np.array_equal(np.asarray(x), np.asarray(y)) for (_, x), (_, y) in zip(a, b))
    with pytest.raises(ValueError, match="sizes"):
        slot_layout(specs[0], rng, sizes=(20.0, 30.0))
    with pytest.raises(ValueError, match="jitter"):
        slot_layout(specs[0], rng, jitter=5.0)
    with pytest.raises(ValueError, match="layout_mode"):
        sample_pairs("train", 1, rng, layout_mode="grid")


def test_blob_reading_matches_the_drawn_geometry():
    """Centroids and areas against closed forms: a 16-px square at (20, 40) has area 256 and centroid (20, 40)."""
    img = render([Placed("blue", "square", 20.0, 40.0, 16.0), Placed("yellow", "circle", 46.0, 14.0, 18.0)])
    blobs = {b.color: b for b in find_blobs(img)}
    assert set(blobs) == {"blue", "yellow"}
    sq, ci = blobs["blue"], blobs["yellow"]
    assert sq.shape == "square" and ci.shape == "circle"
    assert abs(sq.cx - 20) < 0.6 and abs(sq.cy - 40) < 0.6 and abs(sq.area - 256) <= 2 * 16
    assert abs(ci.cx - 46) < 0.6 and abs(ci.cy - 14) < 0.6 and abs(ci.area - np.pi * 81) <= 2 * np.pi * 9


def test_checker_fails_the_claims_an_image_breaks():
    img = render([Placed("red", "circle", 44.0, 30.0, 18.0), Placed("blue", "triangle", 16.0, 30.0, 18.0)])
    ok = check(img, "a red circle right of a blue triangle")
    assert ok.strict and ok.score == 1.0 and [c.type for c in ok.claims] == [
        "color", "shape", "count", "color", "shape", "count", "position"]
    wrong_side = check(img, "a red circle left of a blue triangle")
    assert not wrong_side.strict and [c.type for c in wrong_side.claims if not c.passed] == ["position"]
    assert wrong_side.score == pytest.approx(6 / 7)
    wrong_shape = check(img, "a red square")
    assert [c.type for c in wrong_shape.claims if not c.passed] == ["shape"]
    wrong_count = check(img, "two red circles")
    assert [c.type for c in wrong_count.claims if not c.passed] == ["count"]
    absent = check(img, "a green circle on the left")
    assert absent.score == 0.0 and absent.verdict().count(";") == 3  # colour, shape, count 1 ≠ 0, position
    blank = check(Image.new("RGB", (64, 64), (232, 232, 228)), "a red circle")
    assert blank.score == pytest.approx(0.0) and blank.blobs == ()


def _accuracy(transform, n=300, seed=0):
    rng = random.Random(seed)
    specs = all_specs()
    chosen = [rng.choice(specs) for _ in range(n)]
    return float(np.mean([check(transform(render_spec(s, i)), s).strict for i, s in enumerate(chosen)]))


def _noise(sigma):
    gen = np.random.default_rng(0)
    return lambda im: Image.fromarray(np.clip(np.asarray(im) + gen.normal(0, sigma, (64, 64, 3)), 0, 255)
                                      .astype(np.uint8))


def test_checker_is_at_least_98_percent_right_on_clean_images():
    assert _accuracy(lambda im: im, n=500) >= 0.98


def test_checker_degrades_gracefully_under_blur_and_noise():
    clean = _accuracy(lambda im: im)
    blur = [_accuracy(lambda im, r=r: im.filter(ImageFilter.GaussianBlur(r))) for r in (1, 2, 4)]
    noise = [_accuracy(_noise(s)) for s in (10, 25)]
    print("clean", clean, "blur r=1,2,4", blur, "noise 10,25", noise)
    assert blur[0] >= 0.93 and blur[1] >= 0.9 and noise[0] >= 0.95 and noise[1] >= 0.9
    assert clean >= blur[0] >= blur[1] - 0.02 and blur[1] >= blur[2]  # monotone in blur (sampling slack 2 points)
    assert blur[2] < 0.9  # and it does notice heavy blur: shapes melt into blobs


def test_toy_compositional_reward_scores_claim_fraction_and_refuses_non_captions():
    from deepgen_rl.rewards import get_reward

    img = render([Placed("red", "circle", 44.0, 30.0, 18.0), Placed("blue", "triangle", 16.0, 30.0, 18.0)])
    reward = get_reward("toy_compositional")
    out = reward([img, img, img], ["a red circle right of a blue triangle", "a red square", "a photo of a cat"])
    assert torch.equal(out.valid, torch.tensor([True, True, False]))
    assert torch.allclose(out.scores, torch.tensor([1.0, 2 / 3, 0.0]))
    assert out.info["num_not_toy_caption"] == 1 and out.info["num_failed"] == 1


def test_claim_types_cover_every_claim():
    s = parse_caption("three yellow triangles")
    r = check(render_spec(s, 0), s)
    assert {c.type for c in r.claims} <= set(CLAIM_TYPES) and r.strict


def test_exclusive_claim_fails_colours_the_prompt_does_not_name():
    """The reward option that makes colour claims prompt-specific: an image of a red circle and a blue triangle
    passes the 3 claims of "a red circle" (colour, shape, count) and fails its exclusive claim "only red"."""
    from deepgen_rl.rewards import get_reward

    img = render([Placed("red", "circle", 44.0, 30.0, 18.0), Placed("blue", "triangle", 16.0, 30.0, 18.0)])
    plain, excl = check(img, "a red circle"), check(img, "a red circle", exclusive=True)
    assert plain.score == 1.0 and [c.type for c in plain.claims] == ["color", "shape", "count"]
    assert [(c.type, c.text, c.passed) for c in excl.claims[3:]] == [("exclusive", "only red", False)]
    assert excl.score == pytest.approx(3 / 4)
    both = check(img, "a red circle right of a blue triangle", exclusive=True)
    assert both.strict and both.claims[-1].text == "only red, blue"
    assert check(Image.new("RGB", (64, 64), (232, 232, 228)), "a red circle", exclusive=True).claims[-1].passed

    prompts = ["a red circle", "a red circle right of a blue triangle"]
    assert torch.allclose(get_reward("toy_compositional")([img, img], prompts).scores, torch.tensor([1.0, 1.0]))
    exclusive = get_reward("toy_compositional", exclusive=True)([img, img], prompts)
    assert torch.allclose(exclusive.scores, torch.tensor([3 / 4, 1.0]))
    with pytest.raises(ValueError, match="exclusive must be true or false"):
        get_reward("toy_compositional", exclusive="yes")


def test_blind_reward_ignores_the_prompt_and_scores_a_random_caption():
    """``blind=True`` (the RL test's prompt-blind control): an image scores the same whatever its prompt (a non-toy
    prompt is still refused), and rendered images score about what an image scores against a random caption of the
    grammar (each kind equally likely), far below their own prompts."""
    from deepgen_rl.rewards import get_reward

    blind = get_reward("toy_compositional", blind=True)
    rng = random.Random(0)
    pools = {k: [s for s in all_specs() if s.kind == k] for k in KINDS}
    specs = [rng.choice(pools[k]) for k in KINDS for _ in range(40)]
    images = [render_spec(s, i) for i, s in enumerate(specs)]
    own = blind(images, [caption(s) for s in specs])
    shuffled = blind(images, [caption(s) for s in specs[7:] + specs[:7]])
    assert torch.equal(own.scores, shuffled.scores) and bool(own.valid.all())
    assert blind([images[0]], ["a photo of a cat"]).valid.tolist() == [False]
    # Independent estimate of the blind expectation: each image against fresh random captions (kind first).
    expected = np.mean([check(im, rng.choice(pools[rng.choice(KINDS)])).score
                        for im in images for _ in range(3)])
    true_own = get_reward("toy_compositional")(images, [caption(s) for s in specs]).scores.mean().item()
    assert true_own > 0.95 and abs(own.scores.mean().item() - expected) < 0.06, (true_own, expected)
    assert own.scores.mean().item() < true_own - 0.3
    with pytest.raises(ValueError, match="blind must be true or false"):
        get_reward("toy_compositional", blind="yes")


def _hsv_square_image(hue_deg: float, box=(8, 20, 26, 38), background=(232, 232, 228)):
    """A flat square of one hue (saturation 0.85, value 0.87: vivid) on the world's background, and the hue its
    rounded RGB really has (colorsys, independent of the checker's own hue code)."""
    import colorsys

    from PIL import ImageDraw

    rgb = tuple(int(round(x * 255)) for x in colorsys.hsv_to_rgb(hue_deg / 360, 0.85, 0.87))
    img = Image.new("RGB", (64, 64), background)
    ImageDraw.Draw(img).rectangle(box, fill=rgb)
    return img, colorsys.rgb_to_hsv(*(c / 255 for c in rgb))[0] * 360


def _palette_hue(name: str) -> float:
    import colorsys

    return colorsys.rgb_to_hsv(*(c / 255 for c in COLORS[name]))[0] * 360


@pytest.mark.parametrize("hue", [0.0, 20.0, 30.0, 45.0, 90.0, 150.0, 303.0])
def test_hue_closeness_falls_linearly_from_the_checkers_limit_to_the_opposite_hue(hue):
    """Closed form: 1 within 28° of the colour's hue, 0 at the opposite hue, linear between; the hue of the drawn
    RGB is computed with colorsys, independently of the checker."""
    from deepgen_rl.toy.checker import hue_closeness

    img, h = _hsv_square_image(hue)
    got = hue_closeness(img, list(COLORS))
    for name in COLORS:
        d = abs(h - _palette_hue(name)) % 360
        d = min(d, 360 - d)
        assert got[name] == pytest.approx(min(1.0, (180 - d) / (180 - 28)), abs=1e-4), name
    if 30.0 <= hue <= 330.0:  # the binary checker no longer reads it as red: only the dense value still ranks it
        assert not check(img, "a red square").claims[0].passed and got["red"] < 1.0


def test_hue_closeness_takes_the_best_region_and_ignores_specks():
    from deepgen_rl.toy.checker import hue_closeness

    img = render([Placed("red", "triangle", 16.0, 30.0, 18.0), Placed("blue", "square", 46.0, 30.0, 18.0)])
    got = hue_closeness(img, ["red", "blue", "green"])
    # green (131°) is 99° from blue (230°) and 131° from red: the blue region is the nearer one
    assert got["red"] == 1.0 and got["blue"] == 1.0
    assert got["green"] == pytest.approx((180 - abs(_palette_hue("blue") - _palette_hue("green"))) / 152, abs=0.01)
    assert hue_closeness(Image.new("RGB", (64, 64), (232, 232, 228)), ["red"]) == {"red": 0.0}
    # a region below MIN_AREA (4 x 4 = 16 px) does not count, as in find_blobs
    tiny, _ = _hsv_square_image(0.0, box=(10, 10, 13, 13))
    assert hue_closeness(tiny, ["red"]) == {"red": 0.0}


def test_soft_color_reward_ranks_near_misses_and_keeps_binary_scores_elsewhere():
    """"a red triangle left of a blue square" has 7 claims (+1 exclusive). An orange triangle (hue 30°) with a correct
    blue square fails red's colour, shape and count and the relation: binary 3/7; ``soft_color`` gives the colour
    claim hue_closeness instead: (3 + c)/7 with c from the closed form above; a triangle drawn magenta-red (hue 320°)
    ranks between them. A correct image scores 1 either way."""
    import colorsys

    from PIL import ImageDraw

    from deepgen_rl.rewards import get_reward

    prompt = "a red triangle left of a blue square"
    near = []
    for hue in (30.0, 90.0):
        img = render([Placed("blue", "square", 46.0, 30.0, 18.0)])
        rgb = tuple(int(round(x * 255)) for x in colorsys.hsv_to_rgb(hue / 360, 0.85, 0.87))
        ImageDraw.Draw(img).polygon([(8, 40), (26, 40), (17, 22)], fill=rgb)
        h = colorsys.rgb_to_hsv(*(c / 255 for c in rgb))[0] * 360
        near.append((img, min(1.0, (180 - min(h, 360 - h)) / 152)))
    good = render([Placed("red", "triangle", 16.0, 30.0, 18.0), Placed("blue", "square", 46.0, 30.0, 18.0)])
    images = [near[0][0], near[1][0], good]
    binary = get_reward("toy_compositional")(images, [prompt] * 3).scores
    soft = get_reward("toy_compositional", soft_color=True)(images, [prompt] * 3).scores
    assert torch.allclose(binary, torch.tensor([3 / 7, 3 / 7, 1.0]))
    assert torch.allclose(soft, torch.tensor([(3 + near[0][1]) / 7, (3 + near[1][1]) / 7, 1.0]), atol=1e-4)
    assert soft[0] > soft[1] > binary[1]  # nearer to red ranks higher, where the binary reward ties them
    both = get_reward("toy_compositional", soft_color=True, exclusive=True)(images, [prompt] * 3)
    # exclusive: hue 30° reads as yellow (a colour the prompt does not name: fails), hue 90° as no palette colour
    assert [b.color for b in find_blobs(near[0][0])] == ["yellow", "blue"] and \
        [b.color for b in find_blobs(near[1][0])] == ["blue"]
    assert torch.allclose(both.scores, torch.tensor([(3 + near[0][1]) / 8, (4 + near[1][1]) / 8, 1.0]), atol=1e-4)
    assert both.info["strict_acc"] == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="soft_color must be true or false"):
        get_reward("toy_compositional", soft_color=1)


def test_shape_closeness_of_masks_with_closed_form_features():
    """Masks whose (centroid height, fill, corner fill) are known exactly; the closeness is the module's formula:
    1 where the checker reads the shape, else 1 − (the moves past the thresholds 0.57 / 0.6 / 0.45, scaled by
    0.2 / 0.5 / 0.7), floored at 0."""
    from deepgen_rl.toy.checker import classify_shape, shape_closeness_of_mask

    box = np.ones((8, 8), dtype=bool)  # cy 0.5, fill 1, corners 1: a square
    assert classify_shape(box) == "square"
    assert shape_closeness_of_mask(box, "square") == 1.0
    assert shape_closeness_of_mask(box, "circle") == pytest.approx(1 - 0.55 / 0.7)
    assert shape_closeness_of_mask(box, "triangle") == pytest.approx(1 - min(0.07 / 0.2, 0.4 / 0.5))
    cross = box.copy()  # the four 2x2 corner cells empty: cy 0.5, fill 0.75, corners 0 -> a circle
    for ys in (slice(0, 2), slice(6, 8)):
        for xs in (slice(0, 2), slice(6, 8)):
            cross[ys, xs] = False
    assert classify_shape(cross) == "circle" and shape_closeness_of_mask(cross, "circle") == 1.0
    assert shape_closeness_of_mask(cross, "square") == pytest.approx(1 - 0.45 / 0.7)
    assert shape_closeness_of_mask(cross, "triangle") == pytest.approx(1 - min(0.07 / 0.2, 0.15 / 0.5))
    low = np.zeros((8, 8), dtype=bool)
    low[4:] = True  # rows 4-7: cy (5.5 + 0.5) / 8 = 0.75, fill 0.5, corners 0.5 -> a triangle
    assert classify_shape(low) == "triangle" and shape_closeness_of_mask(low, "triangle") == 1.0
    assert shape_closeness_of_mask(low, "square") == 0.0  # 0.18 / 0.2 + 0.1 / 0.5 = 1.1 > 1
    half = np.zeros((10, 8), dtype=bool)
    half[3:] = True  # rows 3-9: cy (6 + 0.5) / 10 = 0.65, fill 0.7
    cy = 0.65
    corners = (0 + 0 + 1 + 1) / 4  # corner cells of round(2.5) = 2 rows: the top ones empty, the bottom ones full
    assert classify_shape(half) == "triangle"
    assert shape_closeness_of_mask(half, "square") == pytest.approx(1 - (cy - 0.57) / 0.2)  # corners 0.5 >= 0.45
    assert shape_closeness_of_mask(half, "circle") == pytest.approx(
        max(0.0, 1 - (cy - 0.57) / 0.2 - (corners - 0.45) / 0.7))
    with pytest.raises(ValueError, match="unknown shape"):
        shape_closeness_of_mask(box, "star")


def test_shape_closeness_takes_the_worst_blob_of_the_colour_and_zero_without_one():
    from deepgen_rl.toy.checker import blobs_with_masks, shape_closeness

    img = render([Placed("red", "square", 16.0, 16.0, 16.0), Placed("red", "circle", 46.0, 46.0, 16.0),
                  Placed("blue", "circle", 46.0, 16.0, 16.0)])
    found = blobs_with_masks(img)
    assert sorted((b.color, b.shape) for b, _ in found) == [("blue", "circle"), ("red", "circle"), ("red", "square")]
    objs = parse_caption("two red squares").objects + parse_caption("a blue circle").objects + \
        parse_caption("a green circle").objects
    got = shape_closeness(found, objs)
    # "every red blob is a square" fails on the circle: the value is the circle's closeness to square, below 1
    from deepgen_rl.toy.checker import shape_closeness_of_mask
    circle_mask = next(m for b, m in found if b.color == "red" and b.shape == "circle")
    assert got[("red", "square")] == pytest.approx(shape_closeness_of_mask(circle_mask, "square"))
    assert 0.0 < got[("red", "square")] < 1.0
    assert got[("blue", "circle")] == 1.0 and got[("green", "circle")] == 0.0


def test_position_closeness_closed_form_on_blob_centroids():
    from deepgen_rl.toy.checker import Blob, position_closeness

    red, blue = Blob("red", "circle", 100, 40.0, 30.0), Blob("blue", "square", 100, 24.0, 20.0)
    rel = parse_caption("a red circle left of a blue square")
    assert position_closeness([red, blue], rel) == pytest.approx(1 + (24 - 40 - 2) / 32)  # m = -18 px
    assert position_closeness([red, blue], parse_caption("a red circle right of a blue square")) == 1.0
    assert position_closeness([red, blue], parse_caption("a red circle above a blue square")) == \
        pytest.approx(1 + (20 - 30 - 2) / 32)
    assert position_closeness([red, blue], parse_caption("a red circle below a blue square")) == 1.0
    # the largest blob of a colour decides, as in the binary claim; far on the wrong side floors at 0
    far = Blob("red", "circle", 300, 60.0, 30.0)
    assert position_closeness([red, far, Blob("blue", "square", 100, 4.0, 30.0)], rel) == 0.0
    assert position_closeness([red], rel) == 0.0  # blue missing
    assert position_closeness([red], parse_caption("a red circle on the left")) == pytest.approx(1 + (32 - 40) / 32)
    assert position_closeness([red], parse_caption("a red circle on the right")) == 1.0
    assert position_closeness([red], parse_caption("a red circle at the bottom")) == pytest.approx(1 + (30 - 32) / 32)
    assert position_closeness([red], parse_caption("a red circle at the top")) == 1.0
    assert position_closeness([red], parse_caption("a red circle")) == 1.0  # no position claim
    # the binary claim and the dense one agree on pass / fail
    for text in ("a red circle left of a blue square", "a red circle above a blue square"):
        passed = check_blobs_position([red, blue], text)
        assert (position_closeness([red, blue], parse_caption(text)) == 1.0) == passed


def check_blobs_position(blobs, text):
    from deepgen_rl.toy.checker import check_blobs

    return next(c.passed for c in check_blobs(blobs, text).claims if c.type == "position")


def test_soft_shape_and_soft_position_rewards_add_dense_values_only_to_failing_claims():
    """"a red circle left of a blue square" (7 claims) on a correct image scores 1 under every option. Drawn with the
    red object a square and on the wrong side, the binary reward counts 5 of 7 (red's shape and the relation fail);
    ``soft_shape`` adds the red square's closeness to circle, ``soft_position`` 1 + m / 32 with m from the blobs."""
    from deepgen_rl.rewards import get_reward
    from deepgen_rl.toy.checker import blobs_with_masks, shape_closeness_of_mask

    prompt = "a red circle left of a blue square"
    good = render([Placed("red", "circle", 16.0, 30.0, 18.0), Placed("blue", "square", 46.0, 30.0, 18.0)])
    bad = render([Placed("red", "square", 40.0, 30.0, 18.0), Placed("blue", "square", 16.0, 30.0, 18.0)])
    found = blobs_with_masks(bad)
    red = next((b, m) for b, m in found if b.color == "red")
    blue = next(b for b, _ in found if b.color == "blue")
    shape_v = shape_closeness_of_mask(red[1], "circle")
    pos_v = max(0.0, 1 + (blue.cx - red[0].cx - 2) / 32)
    assert 0 < shape_v < 1 and 0 < pos_v < 1 and abs(red[0].cx - blue.cx - 24) < 1.5
    images = [good, bad]
    for kwargs, want_bad in (({}, 5 / 7), ({"soft_shape": True}, (5 + shape_v) / 7),
                             ({"soft_position": True}, (5 + pos_v) / 7),
                             ({"soft_shape": True, "soft_position": True, "soft_color": True},
                              (5 + shape_v + pos_v) / 7)):
        got = get_reward("toy_compositional", **kwargs)(images, [prompt] * 2)
        assert torch.allclose(got.scores, torch.tensor([1.0, want_bad]), atol=1e-6), kwargs
        assert got.info["strict_acc"] == 0.5
    for name in ("soft_shape", "soft_position"):
        with pytest.raises(ValueError, match=f"{name} must be true or false"):
            get_reward("toy_compositional", **{name: "yes"})


def test_precomputed_hue_vivid_gives_the_same_blobs_and_closeness_as_reading_the_image():
    """The reward reads each image's hue / vivid arrays once and hands them to both readers: the results must be
    those of reading the image in each (blurred, noisy renders of every kind, so blobs of several colours)."""
    from deepgen_rl.toy.checker import blobs_with_masks, hue_and_vivid, hue_closeness

    rng = np.random.default_rng(3)
    for i, spec in enumerate(sample_specs("train", 24, seed=5)):
        img = render_spec(spec, seed=i).filter(ImageFilter.GaussianBlur(1.0))
        arr = np.clip(np.asarray(img, dtype=np.float32) + rng.normal(0, 12, (64, 64, 3)), 0, 255).astype(np.uint8)
        hv = hue_and_vivid(arr)
        plain, cached = blobs_with_masks(arr), blobs_with_masks(arr, hue_vivid=hv)
        assert [b for b, _ in plain] == [b for b, _ in cached] and len(plain) >= 1
        assert all(np.array_equal(m1, m2) for (_, m1), (_, m2) in zip(plain, cached))
        assert hue_closeness(arr, list(COLORS)) == hue_closeness(arr, list(COLORS), hue_vivid=hv)


def test_hue_and_vivid_do_not_depend_on_the_image_dtype():
    """Step 1 takes the channels' max and min in the image's own dtype and casts afterwards: a uint8 image and its
    float32 and float64 copies must give the same hue and vivid arrays, bit for bit (noise, blurred renders, and
    pixels on the chroma threshold)."""
    from deepgen_rl.toy.checker import MIN_CHROMA, _hue_and_vivid

    rng = np.random.default_rng(12)
    images = [rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)]
    for i, spec in enumerate(sample_specs("train", 4, seed=9)):
        images.append(np.asarray(render_spec(spec, seed=i).filter(ImageFilter.GaussianBlur(1.0)), dtype=np.uint8))
    edge = rng.integers(0, 256 - MIN_CHROMA, (64, 64, 1)).astype(np.uint8)
    images.append(np.concatenate([edge + MIN_CHROMA, edge, edge + rng.integers(0, 2, (64, 64, 1), dtype=np.uint8)],
                                 axis=-1))
    for arr in images:
        hue, vivid = _hue_and_vivid(arr)
        assert vivid.any() and (~vivid).any()
        for dtype in (np.float32, np.float64):
            h2, v2 = _hue_and_vivid(arr.astype(dtype))
            assert np.array_equal(v2, vivid) and np.array_equal(h2, hue) and h2.dtype == np.float32


def test_vivid_pixels_hue_and_colour_label_agree_with_colorsys():
    """Step 1 of the checker, pixel by pixel, against an independent reading (colorsys): a pixel is vivid iff its
    chroma is >= 60 and its saturation >= 0.4; a vivid pixel's hue is colorsys's (to float32 rounding) and its label
    is the palette colour of nearest hue within 28 degrees, else -1; a pixel that is not vivid is labelled -1 (the
    checker computes hues for vivid pixels only)."""
    import colorsys

    from deepgen_rl.toy.checker import MAX_HUE_DISTANCE, color_labels, hue_and_vivid

    rng = np.random.default_rng(11)
    arr = rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)
    arr[:16] = rng.integers(200, 256, (16, 64, 3), dtype=np.uint8)  # pale rows: mostly not vivid
    hue, vivid = hue_and_vivid(arr)
    labels = color_labels(arr)
    palette = np.array([_palette_hue(n) for n in COLORS])
    checked = 0
    for y, x in np.ndindex(arr.shape[:2]):
        r, g, b = (int(v) for v in arr[y, x])
        h, s, v = colorsys.rgb_to_hsv(r / 255, g / 255, b / 255)
        chroma = max(r, g, b) - min(r, g, b)
        if abs(s - 0.4) < 1e-6:
            continue  # saturation on the threshold: float32 rounding may go either way
        expect_vivid = chroma >= 60 and s >= 0.4
        assert bool(vivid[y, x]) == expect_vivid, (r, g, b)
        if not expect_vivid:
            assert labels[y, x] == -1
            continue
        hd = h * 360
        assert min(abs(hue[y, x] - hd), 360 - abs(hue[y, x] - hd)) < 1e-3, (r, g, b, hue[y, x], hd)
        d = np.abs(palette - hd)
        d = np.minimum(d, 360 - d)
        if abs(d.min() - MAX_HUE_DISTANCE) < 1e-3 or np.sort(d)[1] - d.min() < 1e-3:
            continue  # on a boundary: float32 rounding may go either way
        assert labels[y, x] == (int(d.argmin()) if d.min() <= MAX_HUE_DISTANCE else -1), (r, g, b)
        checked += 1
    assert checked > 1500 and (~vivid).sum() > 500, (checked, (~vivid).sum())
