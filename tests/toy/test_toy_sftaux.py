"""The toy SFT-auxiliary dataset: train-split pairs the checker accepts, loadable by the SFT data code."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from deepgen_rl.toy.checker import check
from deepgen_rl.toy.sftaux import write_toy_sftaux
from deepgen_rl.toy.world import parse_caption


@pytest.mark.parametrize("variant", ["default", "slots"])
def test_pairs_are_train_split_and_pass_the_checker(tmp_path, variant):
    cfg = write_toy_sftaux(tmp_path / "sft", n=48, variant=variant, seed=3)
    rows = [json.loads(x) for x in (cfg.parent / "train.jsonl").read_text().splitlines()]
    assert len(rows) == 48
    passed = 0
    for r in rows:
        spec = parse_caption(r["caption"])
        assert not spec.held_out, r["caption"]  # never a held-out composition
        with Image.open(cfg.parent / r["image"]) as im:
            assert im.size == (64, 64)
            passed += check(np.asarray(im.convert("RGB")), spec).strict
    assert passed >= 46  # the checker is >= 98% correct on clean renders
    assert len({r["caption"] for r in rows}) > 24  # varied, not one caption repeated


def test_deterministic_and_loadable_by_the_sft_data_config(tmp_path):
    from deepgen_rl.sft.data import check_files, load_sft_config

    a = write_toy_sftaux(tmp_path / "a", n=6, variant="slots", seed=1)
    b = write_toy_sftaux(tmp_path / "b", n=6, variant="slots", seed=1)
    assert (a.parent / "train.jsonl").read_text() == (b.parent / "train.jsonl").read_text()
    assert (a.parent / "images/00005.png").read_bytes() == (b.parent / "images/00005.png").read_bytes()
    data = load_sft_config(str(a))
    assert data.image_size == 64 and [d.name for d in data.datasets] == ["toy_train"]
    (records,) = check_files(data)
    assert len(records) == 6 and all(p.is_file() for p, _ in records)
    with pytest.raises(FileExistsError, match="exists"):
        write_toy_sftaux(tmp_path / "a", n=6)
