"""deepgen_rl.toy.eval_blocks: per-block strict gains between two evals, against counts written by hand."""
import json

import pytest

from deepgen_rl.toy.eval_blocks import block_gains, main, read_strict


def write_verdicts(path, strict_of, n_prompts=4, n_dup=16, dataset="toy_heldout"):
    path.mkdir(parents=True, exist_ok=True)
    with open(path / "toy_verdicts.jsonl", "w") as f:
        for i in range(n_prompts):
            for d in range(n_dup):
                f.write(json.dumps({"dataset": dataset, "index": i, "dup": d, "strict": strict_of(i, d)}) + "\n")
        f.write(json.dumps({"dataset": "other_set", "index": 0, "dup": 0, "strict": True}) + "\n")


def test_block_gains_match_hand_counts(tmp_path, capsys):
    # before: prompt 0 passes on every image, the rest never. after: also prompt 1 on dups 0-7 and prompt 2 on
    # dups 8-15 and 12-15 of prompt 3: block 0-7 has 8 + 8 of 32 passing, block 8-15 has 8 + 8 + 4 of 32.
    write_verdicts(tmp_path / "b", lambda i, d: i == 0)
    write_verdicts(tmp_path / "a", lambda i, d: i == 0 or (i == 1 and d < 8) or (i == 2 and d >= 8)
                   or (i == 3 and d >= 12))
    rows = {r["name"]: r for r in block_gains(read_strict(tmp_path / "b"), read_strict(tmp_path / "a"), block=8)}
    assert set(rows) == {"dups 0-7", "dups 8-15", "all", "fresh"}
    assert rows["dups 0-7"]["before"] == 8 / 32 and rows["dups 0-7"]["after"] == 16 / 32
    assert rows["dups 0-7"]["gain_points"] == pytest.approx(25.0)
    assert rows["dups 8-15"]["after"] == 20 / 32 and rows["dups 8-15"]["gain_points"] == pytest.approx(37.5)
    assert rows["all"]["images"] == 64 and rows["all"]["gain_points"] == pytest.approx(100 * (36 - 16) / 64)
    assert rows["fresh"]["dups"] == (8, 15) and rows["fresh"]["gain_points"] == pytest.approx(37.5)
    assert main([str(tmp_path / "b"), str(tmp_path / "a"), "--block", "8"]) == 0
    out = capsys.readouterr().out
    assert "+25.0" in out and "+37.5" in out and "standard deviation 8.8 points" in out


def test_a_single_block_has_no_fresh_row_and_mismatched_evals_are_refused(tmp_path, capsys):
    write_verdicts(tmp_path / "b", lambda i, d: False, n_dup=8)
    write_verdicts(tmp_path / "a", lambda i, d: True, n_dup=8)
    rows = block_gains(read_strict(tmp_path / "b"), read_strict(tmp_path / "a"))
    assert [r["name"] for r in rows] == ["dups 0-7", "all"] and rows[1]["gain_points"] == pytest.approx(100.0)
    write_verdicts(tmp_path / "a16", lambda i, d: True, n_dup=16)
    with pytest.raises(ValueError, match="same images"):
        block_gains(read_strict(tmp_path / "b"), read_strict(tmp_path / "a16"))
    with pytest.raises(SystemExit):
        main([str(tmp_path / "b"), str(tmp_path / "missing")])
    assert "no toy_verdicts.jsonl" in capsys.readouterr().err
    with pytest.raises(ValueError, match="no verdicts of dataset 'nope'"):
        read_strict(tmp_path / "b", dataset="nope")


def test_the_x32_config_is_the_headline_eval_with_more_duplicates():
    import dataclasses
    from pathlib import Path

    from deepgen_rl.evaluation.config import load_eval_config

    here = Path(__file__).resolve().parent
    (base,), (x32,) = load_eval_config(here / "eval_toy_heldout.yaml"), load_eval_config(here / "eval_toy_heldout_x32.yaml")
    assert base.duplicates == 8 and x32.duplicates == 32
    assert dataclasses.replace(x32, duplicates=8) == base
