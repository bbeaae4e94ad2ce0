"""SFT-auxiliary data: shipped demo dataset, rank sharding, weights, missing-file errors, resume."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from scipy.stats import chisquare

from deepgen_rl.sft.data import WeightedMixtureSampler, build_sft_loader, load_image, load_sft_config
from deepgen_rl.sft.demo_data import demo_records

ROOT = Path(__file__).resolve().parents[2]
DEMO_CONFIG = ROOT / "assets/sftaux/demo.py"
DEMO_DIR = ROOT / "assets/sftaux/demo"


def test_shipped_demo_dataset_matches_generator_and_is_small():
    records = demo_records()
    for name, items in records.items():
        lines = (DEMO_DIR / f"{name}.jsonl").read_text(encoding="utf-8").splitlines()
        assert [json.loads(line) for line in lines] == [{"image": p, "caption": c} for p, c, _ in items]
        for rel_path, _, image in items:
            with Image.open(DEMO_DIR / rel_path) as shipped:
                assert shipped.size == (64, 64)
            if "shape" in rel_path:  # no font rendering involved: must be pixel-identical
                assert np.array_equal(np.asarray(Image.open(DEMO_DIR / rel_path).convert("RGB")), np.asarray(image))
    assert sum(len(v) for v in records.values()) == 24
    assert sum(f.stat().st_size for f in DEMO_DIR.rglob("*") if f.is_file()) < 300_000


def test_demo_loader_batches_and_two_ranks_disjoint():
    loaders = [build_sft_loader(DEMO_CONFIG, rank=r, world_size=2, seed=3) for r in range(2)]
    cfg = load_sft_config(DEMO_CONFIG)
    assert cfg.image_size == 64 and [d.name for d in cfg.datasets] == ["shapes", "words"]
    batch = next(iter(loaders[0]))
    assert batch["pixel_values"].shape == (4, 3, 64, 64) and batch["pixel_values"].dtype == torch.float32
    assert 0.0 <= batch["pixel_values"].min() and batch["pixel_values"].max() <= 1.0
    assert len(batch["texts"]) == 4 and all(isinstance(t, str) and t for t in batch["texts"])

    # Draw index k of rank r is global draw 2k + r; within one pass over a dataset no sample repeats anywhere.
    samplers = [WeightedMixtureSampler([16, 8], [1.0, 1.0], rank=r, world_size=2, seed=3) for r in range(2)]
    draws = [[s.next_index() for _ in range(200)] for s in samplers]
    for k in range(200):
        assert draws[0][k] != draws[1][k]
    seen: dict[tuple[int, int], int] = {}  # (dataset, sample) -> pass, checked in global order
    counters = [0, 0]
    for k in range(200):
        for r in range(2):
            d, i = draws[r][k]
            passes = counters[d] // [16, 8][d]
            assert seen.get((d, i), -1) < passes, "sample repeated within one pass over its dataset"
            seen[(d, i)] = passes
            counters[d] += 1
    # the same loader config on both ranks gives the same texts as the sampler indices say
    texts = [next(iter(ld))["texts"] for ld in loaders]
    assert not set(texts[0]) & set(texts[1])


def test_mixture_weights_respected_chi_square():
    weights = [1.0, 2.0, 5.0]
    n_per_rank = 3000
    counts = np.zeros(3)
    for rank in range(2):
        sampler = WeightedMixtureSampler([10, 50, 7], weights, rank=rank, world_size=2, seed=11)
        for _ in range(n_per_rank):
            counts[sampler.next_index()[0]] += 1
    total = counts.sum()
    expected = total * np.array(weights) / sum(weights)
    assert chisquare(counts, expected).pvalue > 1e-3
    # power check: the size-proportional weighting (10:50:7) must be rejected by the same test
    wrong = total * np.array([10, 50, 7]) / 67
    assert chisquare(counts, wrong).pvalue < 1e-6
    # and a milder mistake (1:2:4 instead of 1:2:5)
    assert chisquare(counts, total * np.array([1, 2, 4]) / 7).pvalue < 1e-3


def test_sampler_deterministic_and_seed_dependent():
    a = [WeightedMixtureSampler([5, 9], [1, 3], seed=1).next_index() for _ in range(1)]
    s1, s2, s3 = (WeightedMixtureSampler([5, 9], [1, 3], seed=seed) for seed in (1, 1, 2))
    d1 = [s1.next_index() for _ in range(50)]
    assert d1 == [s2.next_index() for _ in range(50)]
    assert d1 != [s3.next_index() for _ in range(50)]
    assert a[0] == d1[0]


def test_missing_files_error_lists_all(tmp_path):
    (tmp_path / "a").mkdir()
    Image.new("RGB", (8, 8)).save(tmp_path / "a/ok.png")
    (tmp_path / "a/anno.jsonl").write_text(
        "\n".join(json.dumps(r) for r in [{"image": "ok.png", "caption": "x"}, {"image": "gone1.png", "caption": "y"},
                                          {"image": "sub/gone2.png", "caption": "z"}]) + "\n")
    (tmp_path / "b.json").write_text(json.dumps([{"image": "gone3.png", "caption": "w"}]))
    config = tmp_path / "cfg.py"
    config.write_text(
        "image_size = 8\n"
        "datasets = [dict(name='a', annotation='a/anno.jsonl', weight=1),\n"
        "            dict(name='b', annotation='b.json', weight=1, image_root='imgs'),\n"
        "            dict(name='c', annotation='nope/c.jsonl', weight=1),\n"
        "            dict(name='d', annotation='nope/d.json', weight=2)]\n")
    with pytest.raises(FileNotFoundError) as info:
        build_sft_loader(config, rank=0, world_size=1, seed=0)
    message = str(info.value)
    for expected in ["gone1.png", "sub/gone2.png", "imgs/gone3.png", "nope/c.jsonl", "nope/d.json"]:
        assert expected in message, message
    assert "5 missing file(s)" in message and "ok.png" not in message


def test_env_data_root_and_resize_center_crop(tmp_path, monkeypatch):
    img = np.zeros((20, 40, 3), dtype=np.uint8)
    img[:, 10:30] = 255  # white centre band exactly as wide as the crop after resizing 20x40 -> 10x20
    Image.fromarray(img).save(tmp_path / "wide.png")
    (tmp_path / "anno.jsonl").write_text(json.dumps({"image": "wide.png", "caption": "band"}) + "\n")
    config = tmp_path / "cfg" / "env.py"
    config.parent.mkdir()
    config.write_text("import os\nDATA_ROOT = os.environ.get('DATA_ROOT', '')\nimage_size = 10\nbatch_size = 2\n"
                      "datasets = [dict(name='w', annotation=os.path.join(DATA_ROOT, 'anno.jsonl'))]\n")
    monkeypatch.setenv("DATA_ROOT", str(tmp_path))
    batch = next(iter(build_sft_loader(config, rank=0, world_size=1, seed=0)))
    assert batch["pixel_values"].shape == (2, 3, 10, 10) and batch["texts"] == ["band", "band"]
    x = load_image(tmp_path / "wide.png", 10)
    assert x[:, :, 2:8].min() > 0.95  # the crop kept the centre band


def test_resume_continues_the_same_stream():
    reference = build_sft_loader(DEMO_CONFIG, rank=1, world_size=2, seed=5, batch_size=3)
    it = iter(reference)
    stream = [next(it) for _ in range(8)]

    first = build_sft_loader(DEMO_CONFIG, rank=1, world_size=2, seed=5, batch_size=3, num_workers=2)
    it = iter(first)
    for k in range(3):  # workers prefetch further than this; the state must still point after batch 3
        assert next(it)["texts"] == stream[k]["texts"]
    state = first.state_dict()
    del it

    resumed = build_sft_loader(DEMO_CONFIG, rank=1, world_size=2, seed=5, batch_size=3)
    resumed.load_state_dict(state)
    it = iter(resumed)
    for k in range(3, 8):
        batch = next(it)
        assert batch["texts"] == stream[k]["texts"]
        assert torch.equal(batch["pixel_values"], stream[k]["pixel_values"])


@pytest.mark.parametrize("world_size,sizes", [(4, [12, 30]), (8, [28, 29, 100])])
def test_ranks_disjoint_for_every_draw_index_across_pass_boundaries(world_size, sizes):
    samplers = [WeightedMixtureSampler(sizes, [1.0] * len(sizes), rank=r, world_size=world_size, seed=7)
                for r in range(world_size)]
    for _ in range(400):
        block = [s.next_index() for s in samplers]
        assert len(set(block)) == world_size, block
