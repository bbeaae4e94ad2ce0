"""run_report reads a run's eval folders back and computes the docs' statistics: checked on hand-made runs whose
answers are known in closed form (rendered images of the right or wrong caption)."""

from __future__ import annotations

import json
import math
import os

import pytest
from PIL import Image

from deepgen_rl.toy.evaluate import check_images, summarize, write_toy_report
from deepgen_rl.toy.run_report import main, run_statistics
from deepgen_rl.toy.world import BACKGROUND, parse_caption, render_spec

BLANK = Image.new("RGB", (64, 64), BACKGROUND)  # no vivid pixel: every claim fails
PROMPTS = ["a red circle", "two blue squares", "a green triangle on the left", "a yellow circle above a cyan square",
           "three magenta circles", "a blue triangle at the top"]


def _write_step(root, step, images_per_prompt, mtime):
    """eval/step_<step> as the trainer's toy eval writes it; images_per_prompt[i] = images of prompt i."""
    d = root / "eval" / f"step_{step}"
    (d / "toy_heldout").mkdir(parents=True)
    verdicts = []
    for i, imgs in enumerate(images_per_prompt):
        for j, im in enumerate(imgs):
            rel = f"toy_heldout/{i}_{j}.png"
            im.save(d / rel)
            v = check_images([im], [PROMPTS[i]])[0].to_dict()
            verdicts.append({"dataset": "toy_heldout", "index": i, "dup": j, "rel_path": rel, **v})
    write_toy_report(d, {"toy_heldout": summarize(verdicts)}, verdicts)
    os.utime(d / "toy_summary.json", (mtime, mtime))


def _drawn(i, seed=0):
    return render_spec(parse_caption(PROMPTS[i]), seed)


def test_run_statistics_against_closed_forms(tmp_path):
    # step 0: every prompt gets BLANK images (no claim passes); step 10: prompts 0-3 get two correct images each,
    # prompts 4-5 stay BLANK; step 20: every prompt's images are drawn for the NEXT prompt (prompt-blind shuffle)
    _write_step(tmp_path, 0, [[BLANK, BLANK] for _ in PROMPTS], 1000.0)
    _write_step(tmp_path, 10, [[_drawn(i), _drawn(i, 1)] if i < 4 else [BLANK, BLANK] for i in range(6)], 1090.0)
    _write_step(tmp_path, 20, [[_drawn((i + 1) % 6)] * 2 for i in range(6)], 1180.0)
    rows = run_statistics(tmp_path, t0=970.0)
    assert [r["step"] for r in rows] == [0, 10, 20]
    assert [r["minutes"] for r in rows] == pytest.approx([0.5, 2.0, 3.5])
    r0, r10, r20 = rows
    assert r0["strict"]["mean"] == 0.0 and r0["own"]["mean"] == 0.0 and r0["other"]["mean"] == 0.0
    # 4 of 6 prompts pass everything at step 10: up 4, down 0, p = 2^-4
    assert r10["strict"]["mean"] == pytest.approx(4 / 6)
    assert (r10["strict"]["up"], r10["strict"]["down"]) == (4, 0)
    assert r10["strict"]["p"] == pytest.approx(1 / 16)
    assert r10["own"]["mean"] == pytest.approx(4 / 6)
    assert r10["strict_by_kind"]["single"] == 1.0 and r10["strict_by_kind"]["count"] == 0.5
    # own - other: the 4 drawn prompts score 1 on their own claims and < 1 on the others', so they go up; the
    # BLANK ones stay at 0 - 0 (ties, dropped)
    assert r10["own_minus_other"]["up"] == 4 and r10["own_minus_other"]["down"] == 0
    # step 20 is prompt-blind in the sense of the checker: each image is another prompt's, so own is what the
    # shuffled caption scores, and own - other cannot be large on every prompt
    assert r20["own"]["mean"] < 0.8
    assert r20["own_minus_other"]["mean"] < r10["own_minus_other"]["mean"]


def test_sign_test_p_matches_the_binomial_tail(tmp_path):
    _write_step(tmp_path, 0, [[_drawn(i)] if i < 2 else [BLANK] for i in range(6)], 10.0)
    # prompts 0,1 fail now (down 2); prompts 2..5 pass (up 4): p = P(Bin(6, 1/2) >= 4) = 22/64
    _write_step(tmp_path, 5, [[BLANK] if i < 2 else [_drawn(i)] for i in range(6)], 20.0)
    r = run_statistics(tmp_path)[1]
    assert (r["strict"]["up"], r["strict"]["down"]) == (4, 2)
    assert r["strict"]["p"] == pytest.approx(sum(math.comb(6, k) for k in range(4, 7)) / 64)
    assert r["minutes"] == pytest.approx(10 / 60)  # counted from the first eval without --t0


def test_cli_prints_the_table_and_writes_json(tmp_path, capsys):
    _write_step(tmp_path, 0, [[BLANK] for _ in PROMPTS], 10.0)
    _write_step(tmp_path, 10, [[_drawn(i)] for i in range(6)], 70.0)
    out = tmp_path / "r.json"
    assert main([str(tmp_path), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "1.000 (6/0, p 0.016)" in text  # strict at step 10: 6 up, p = 2^-6
    assert json.loads(out.read_text())[1]["strict"]["up"] == 6


def test_cli_errors_name_what_is_missing(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main([str(tmp_path)])
    assert e.value.code == 2 and "eval does not exist" in capsys.readouterr().err
    _write_step(tmp_path, 0, [[BLANK] for _ in PROMPTS], 10.0)
    with pytest.raises(SystemExit):
        main([str(tmp_path), "--dataset", "nope"])
    assert "toy_heldout" in capsys.readouterr().err


def test_quickstart_report_takes_the_runs_report_json_only_when_it_covers_the_same_evals(tmp_path):
    from deepgen_rl.toy.quickstart import own_vs_other

    _write_step(tmp_path, 0, [[BLANK] for _ in PROMPTS], 10.0)
    _write_step(tmp_path, 10, [[_drawn(i)] for i in range(6)], 70.0)
    evals = {0: {}, 10: {}}
    first, last = own_vs_other(tmp_path, evals)  # no report.json: computed
    assert (first["step"], last["step"]) == (0, 10) and last["own"]["mean"] == 1.0 and last["own"]["up"] == 6
    # the script's report.json, as run_report --json writes it, is used as it is (here marked to tell it apart)
    rows = run_statistics(tmp_path)
    rows[1]["own"]["mean"] = 0.123
    (tmp_path / "report.json").write_text(json.dumps(rows))
    assert own_vs_other(tmp_path, evals)[1]["own"]["mean"] == 0.123
    # a report.json of other eval steps (the run went on after it was written) is not: recomputed
    _write_step(tmp_path, 20, [[BLANK] for _ in PROMPTS], 130.0)
    first, last = own_vs_other(tmp_path, {0: {}, 10: {}, 20: {}})
    assert last["step"] == 20 and last["own"]["mean"] == 0.0 and (last["own"]["up"], last["own"]["down"]) == (0, 0)
