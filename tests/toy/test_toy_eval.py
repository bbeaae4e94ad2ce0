"""Toy-world evaluation: metrics against hand counts, and ``scoring: toy`` through the eval runner (standalone CLI)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from deepgen_rl.toy.evaluate import check_images, summarize, summary_metrics
from deepgen_rl.toy.world import BACKGROUND, parse_caption, render_spec

ROOT = Path(__file__).resolve().parents[2]


def test_summary_counts_claims_by_type_and_kind():
    prompts = ["a red circle", "two blue circles", "a green square on the left", "a red circle left of a blue square"]
    images = [render_spec(parse_caption(p), 0) for p in prompts[:3]] + [Image.new("RGB", (64, 64), BACKGROUND)]
    s = summarize([v.to_dict() for v in check_images(images, prompts)])
    # 3 drawn images pass everything; the blank one fails all 7 claims of the relation prompt
    assert s["num_images"] == 4 and s["strict_acc"] == 0.75
    assert s["claim_score"] == pytest.approx((1 + 1 + 1 + 0) / 4)
    assert s["claims_by_type"] == {"color": 5, "shape": 5, "count": 5, "position": 2}
    assert s["claim_acc"]["color"] == pytest.approx(3 / 5) and s["claim_acc"]["position"] == pytest.approx(1 / 2)
    assert s["strict_acc_by_kind"] == {"single": 1.0, "count": 1.0, "region": 1.0, "relation": 0.0}
    m = summary_metrics("toy", s)
    assert m["eval/toy/strict_acc"] == 0.75 and m["eval/toy/claim_acc/position"] == 0.5
    assert m["eval/toy/strict_acc/relation"] == 0.0


def test_toy_scoring_runs_through_the_eval_runner_standalone(tmp_path):
    """The standalone CLI on the tiny random model: every image is checked, metrics and both reports are written."""
    from deepgen_rl.toy.eval_cli import main

    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ["a red circle", "three cyan squares"]))
    (tmp_path / "eval.yaml").write_text(
        "datasets:\n  - name: toy_small\n    path: p.jsonl\n    cfg_scale: 0\n    num_inference_steps: 2\n"
        "    duplicates: 2\n    scoring: toy\n")
    out = tmp_path / "out"
    assert main(["--output_dir", str(out), "--model_config", str(ROOT / "configs/models/deepgen_tiny.py"),
                 "--eval_dataset_config", str(tmp_path / "eval.yaml"), "--step", "3"]) == 0
    step = out / "step_3"
    verdicts = [json.loads(line) for line in (step / "toy_verdicts.jsonl").read_text().splitlines()]
    assert len(verdicts) == 4 and {(v["index"], v["dup"]) for v in verdicts} == {(0, 0), (0, 1), (1, 0), (1, 1)}
    summary = json.loads((step / "toy_summary.json").read_text())["toy_small"]
    assert summary["num_images"] == 4 and summary["claims_by_type"]["count"] == 4
    assert "toy_small" in (step / "toy.html").read_text() and (step / "index.html").is_file()


def test_other_prompt_scores_separate_prompt_following_from_prompt_blind_images():
    """Rendered images of their own captions score ~1 on them and far less on other captions; one image handed to
    every prompt (a prompt-blind model) has, over the set, exactly the same mean score on the other prompts as on
    its "own" ones (each prompt is an other prompt of n images and the own prompt of one)."""
    from deepgen_rl.toy.evaluate import other_prompt_scores
    from deepgen_rl.toy.world import caption, render_spec, sample_specs

    specs = list({caption(s): s for s in sample_specs("train", 40, seed=3)}.values())[:16]
    prompts = [caption(s) for s in specs]
    images = [render_spec(s, seed=i) for i, s in enumerate(specs)]
    own = [v.result.score for v in check_images(images, prompts)]
    other = other_prompt_scores(images, prompts, n_others=5)
    assert sum(own) / len(own) > 0.95 and sum(other) / len(other) < 0.6

    blind = [images[0]] * len(prompts)
    own_b = [v.result.score for v in check_images(blind, prompts)]
    other_b = other_prompt_scores(blind, prompts, n_others=5)
    assert sum(own_b) / len(own_b) == pytest.approx(sum(other_b) / len(other_b), abs=1e-12)
    # by hand for image 0 checked against prompts 1..5
    assert other_b[0] == pytest.approx(sum(v.result.score for v in check_images(blind[:5], prompts[1:6])) / 5)
    with pytest.raises(ValueError, match="two distinct prompts"):
        other_prompt_scores(images[:2], [prompts[0]] * 2)


def test_quickstart_report_reads_the_reward_option_from_the_checkpoint(tmp_path):
    """The report says the run trained with exclusive=true only when the checkpoint's training args say so."""
    import json

    from deepgen_rl.toy.quickstart import _trained_exclusive

    assert not _trained_exclusive(None) and not _trained_exclusive(tmp_path)
    for kwargs, expected in (('{"toy_compositional": {"exclusive": true}}', True), ("{}", False),
                             ('{"toy_compositional": {"exclusive": false}}', False)):
        (tmp_path / "training_args.json").write_text(json.dumps({"reward_kwargs": kwargs, "learning_rate": 1e-4}))
        assert _trained_exclusive(tmp_path) is expected


def test_quickstart_grids_count_every_change_and_show_the_first_changed_images(tmp_path):
    """The before/after grid shows image 0 of the first prompts whatever their outcome; the changed grid shows the
    first FAIL->PASS images, then the first PASS->FAIL ones, and is not written when no verdict changed."""
    from PIL import Image

    from deepgen_rl.toy.evaluate import HELDOUT
    from deepgen_rl.toy.quickstart import before_after_grid

    def table(step, strict):  # 5 prompts x 2 images; strict[(index, dup)] is the verdict
        rows = []
        for (i, d), ok in sorted(strict.items()):
            rel = f"img_{i}_{d}.png"
            folder = tmp_path / "eval" / f"step_{step}"
            folder.mkdir(parents=True, exist_ok=True)
            Image.new("RGB", (8, 8), (40 * i, 100 * d, 200 if ok else 0)).save(folder / rel)
            rows.append(dict(dataset=HELDOUT, index=i, dup=d, rel_path=rel, prompt=f"p{i}", strict=ok,
                             claims=[dict(type="color", passed=ok)]))
        return rows

    keys = [(i, d) for i in range(5) for d in range(2)]
    before = {k: k in {(0, 0), (1, 1), (3, 0)} for k in keys}
    after = {**before, (0, 0): False, (2, 0): True, (2, 1): True, (4, 1): True}
    verdicts = {0: table(0, before), 7: table(7, after)}
    path, changes, changed = before_after_grid(tmp_path, verdicts, tmp_path / "ba.png", num_prompts=3,
                                               changed_path=tmp_path / "ch.png", num_changed=2)
    assert changes == {"fail->pass": 3, "pass->fail": 1, "unchanged": 6}
    assert changed == [("prompt 2, image 0", "fail->pass"), ("prompt 2, image 1", "fail->pass"),
                       ("prompt 0, image 0", "pass->fail")]
    with Image.open(path) as im, Image.open(tmp_path / "ch.png") as ch:
        assert im.size[0] == 3 * 160 and ch.size[0] == 3 * 160  # 3 prompts; 2 + 1 changed images
        # top-left of the changed grid: prompt 2 image 0 at step 0 (FAIL: blue 0), below it at step 7 (PASS: 200)
        assert ch.getpixel((80, 80)) == (80, 0, 0) and ch.getpixel((80, 160 + 44 + 80)) == (80, 0, 200)
    (tmp_path / "ch.png").unlink()
    _, changes, changed = before_after_grid(tmp_path, {0: verdicts[0], 7: table(7, before)}, tmp_path / "ba.png",
                                            changed_path=tmp_path / "ch.png")
    assert changes["unchanged"] == 10 and changed is None and not (tmp_path / "ch.png").exists()


def test_eval_cli_use_ema_loads_the_checkpoints_ema_weights(tmp_path):
    """``--use_ema`` evaluates ``ema_dit.safetensors`` (parameters only; buffers stay as built), refuses a checkpoint
    without one, an EMA that lacks a parameter, and a missing ``--checkpoint``."""
    import torch
    from safetensors.torch import save_file

    from deepgen_rl.models import build_model
    from deepgen_rl.toy.eval_cli import load_ema_dit, main

    tiny = str(ROOT / "configs/models/deepgen_tiny.py")
    built = build_model(tiny).transformer
    params = {k: v.detach().clone().contiguous() for k, v in built.named_parameters()}
    buffers = {k: v.clone() for k, v in built.named_buffers()}
    ckpt = tmp_path / "checkpoint-3"
    ckpt.mkdir()
    save_file({k: v + 1.0 for k, v in params.items()}, str(ckpt / "dit.safetensors"))
    save_file({k: v - 2.0 for k, v in params.items()}, str(ckpt / "ema_dit.safetensors"))
    (ckpt / "checkpoint_meta.json").write_text(json.dumps(
        {"format": "deepgen_rl.checkpoint.v1", "global_step": 3, "zero_stage": 0, "world_size": 1, "has_ema": True}))

    model = build_model(tiny)
    load_ema_dit(model, str(ckpt))
    got = dict(model.transformer.named_parameters())
    assert all(torch.equal(got[k], params[k] - 2.0) for k in params)
    assert all(torch.equal(b, buffers[k]) for k, b in model.transformer.named_buffers())

    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "a red circle"}) + "\n")
    (tmp_path / "eval.yaml").write_text(
        "datasets:\n  - name: toy_small\n    path: p.jsonl\n    cfg_scale: 0\n    num_inference_steps: 2\n"
        "    duplicates: 1\n    scoring: toy\n")
    common = ["--model_config", tiny, "--eval_dataset_config", str(tmp_path / "eval.yaml")]
    assert main(["--output_dir", str(tmp_path / "out"), "--checkpoint", str(ckpt), "--use_ema"] + common) == 0
    assert json.loads((tmp_path / "out/step_0/toy_summary.json").read_text())["toy_small"]["num_images"] == 1

    with pytest.raises(SystemExit) as e:
        main(["--output_dir", str(tmp_path / "o2"), "--use_ema"] + common)
    assert e.value.code == 2
    (ckpt / "ema_dit.safetensors").unlink()
    with pytest.raises(SystemExit):
        main(["--output_dir", str(tmp_path / "o3"), "--checkpoint", str(ckpt), "--use_ema"] + common)
    first = sorted(params)[0]
    save_file({k: v for k, v in params.items() if k != first}, str(ckpt / "ema_dit.safetensors"))
    with pytest.raises(ValueError, match="missing"):
        load_ema_dit(build_model(tiny), str(ckpt))
    save_file({k: (v[:1] if k == first else v) for k, v in params.items()}, str(ckpt / "ema_dit.safetensors"))
    with pytest.raises(ValueError, match=f"shape mismatch: .*{first}: checkpoint "):
        load_ema_dit(build_model(tiny), str(ckpt))


@pytest.mark.parametrize("flag", [False, True])
def test_eval_cli_cpu_fast_gelu_evaluates_with_the_patched_gelu(tmp_path, monkeypatch, flag):
    """``--cpu_fast_gelu`` evaluates as training with ``--cpu_fast_gelu true`` does: the DiT that generated the
    images ran its tanh GELUs as x·sigmoid(2u); without the flag it ran ATen's."""
    import deepgen_rl.evaluation.runner as runner
    from deepgen_rl.models.deepgen.cpu_gelu import uses_cpu_fast_gelu
    from deepgen_rl.toy.eval_cli import main

    seen = []
    real = runner.run_unigenbench_eval

    def spy(model, *args, **kwargs):
        out = real(model, *args, **kwargs)
        seen.append((model.cpu_fast_gelu, uses_cpu_fast_gelu(model.transformer)))
        return out

    monkeypatch.setattr(runner, "run_unigenbench_eval", spy)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "a red circle"}) + "\n")
    (tmp_path / "eval.yaml").write_text(
        "datasets:\n  - name: toy_small\n    path: p.jsonl\n    cfg_scale: 0\n    num_inference_steps: 2\n"
        "    duplicates: 1\n    scoring: toy\n")
    argv = ["--output_dir", str(tmp_path / "out"), "--model_config", str(ROOT / "configs/models/deepgen_tiny.py"),
            "--eval_dataset_config", str(tmp_path / "eval.yaml")] + (["--cpu_fast_gelu"] if flag else [])
    assert main(argv) == 0
    assert seen == [(flag, flag)]
