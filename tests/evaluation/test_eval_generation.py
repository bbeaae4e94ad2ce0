"""Eval generation with a pure-torch fake model, and the trainer-facing run_unigenbench_eval."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import torch
from PIL import Image

from deepgen_rl.evaluation.config import EvalDatasetSpec, load_eval_config
from deepgen_rl.evaluation.generate import generate_eval_images, item_seed, sample_latents, shard_items
from deepgen_rl.evaluation.runner import run_unigenbench_eval
from deepgen_rl.evaluation.unigenbench import JudgeConfig
from eval_helpers import FakeModel, free_port

REPO = Path(__file__).resolve().parents[2]
DEMO_YAML = REPO / "assets/rl_datasets/demo/eval/eval_demo.yaml"
KW = dict(height=32, width=32, batch_size=3, progress=False)


def _spec(steps=4, cfg=4.0, dups=2):
    (spec, _) = load_eval_config(DEMO_YAML)
    spec.num_inference_steps, spec.cfg_scale, spec.duplicates = steps, cfg, dups
    return spec


def _pngs(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*.png"))}


@pytest.mark.parametrize("mode", ["ode", "sde"])
def test_generation_is_deterministic_and_batch_invariant(tmp_path, mode):
    spec = _spec()
    a = generate_eval_images(FakeModel(), spec, tmp_path / "a", inference_mode=mode, seed=7, **KW)
    generate_eval_images(FakeModel(), spec, tmp_path / "b", inference_mode=mode, seed=7, **KW)
    generate_eval_images(FakeModel(), spec, tmp_path / "c", inference_mode=mode, seed=7,
                         **{**KW, "batch_size": 5})
    generate_eval_images(FakeModel(), spec, tmp_path / "d", inference_mode=mode, seed=8, **KW)
    pa = _pngs(tmp_path / "a")
    assert len(pa) == 12 and sorted(pa) == sorted(f"demo_unigenbench/{i}.{d}.png" for i in range(6) for d in range(2))
    assert pa == _pngs(tmp_path / "b") == _pngs(tmp_path / "c")
    pd = _pngs(tmp_path / "d")
    assert all(pa[k] != pd[k] for k in pa)
    assert [(r.index, r.dup) for r in a] == [(i, d) for i in range(6) for d in range(2)]
    assert a[0].seed == item_seed(7, "demo_unigenbench", 0, 0) != item_seed(7, "demo_unigenbench", 0, 1)
    assert len(set(pa.values())) == 12  # every (index, dup) has its own noise


def test_sharding_covers_every_item_once_and_matches_single_rank(tmp_path):
    spec = _spec()
    generate_eval_images(FakeModel(), spec, tmp_path / "all", **KW)
    single = _pngs(tmp_path / "all")
    shards = [generate_eval_images(FakeModel(), spec, tmp_path / "ranks", rank=r, world_size=2, **KW)
              for r in range(2)]
    keys = [(rec.index, rec.dup) for shard in shards for rec in shard]
    assert sorted(keys) == [(i, d) for i in range(6) for d in range(2)] and len(set(keys)) == len(keys)
    items = [(p.index, d) for p in spec.prompts for d in range(2)]
    assert [(r.index, r.dup) for r in shards[1]] == items[1::2]  # item i -> rank i % world_size
    assert _pngs(tmp_path / "ranks") == single
    with pytest.raises(ValueError):
        shard_items(spec, 2, 2)


def test_cfg_uses_one_doubled_forward_per_step(tmp_path):
    spec = _spec(steps=5, cfg=4.0)
    model = FakeModel()
    generate_eval_images(model, spec, tmp_path, **KW)  # 12 items, batches of 3
    assert model.forward_batches == [6] * (5 * 4)
    model = FakeModel()
    generate_eval_images(model, _spec(steps=5, cfg=1.0), tmp_path / "nocfg", **KW)
    assert model.forward_batches == [3] * (5 * 4)


def test_cfg_combine_formula():
    """With a = 0 the velocity is the constant c(prompt), so ODE gives x0 = noise − (c_u + s·(c_c − c_u))."""
    model = FakeModel(a=0.0)
    noise = torch.randn(2, 16, 2, 2, generator=torch.Generator().manual_seed(0))
    cond, uncond = model.encode_prompts(["a cat", "a dog"]), model.encode_prompts([""])
    c_c, c_u = cond.pooled_embeds[:, 0].view(-1, 1, 1, 1), uncond.pooled_embeds[0, 0]
    for s in (4.0, 2.5):
        out = sample_latents(model, cond, noise, cfg_scale=s, num_inference_steps=6, uncond=uncond)
        torch.testing.assert_close(out, noise - (c_u + s * (c_c - c_u)), rtol=1e-5, atol=1e-5)
    out = sample_latents(model, cond, noise, cfg_scale=1.0, num_inference_steps=6)
    torch.testing.assert_close(out, noise - c_c, rtol=1e-5, atol=1e-5)


def test_transformer_override_is_used(tmp_path):
    spec = _spec(steps=3)
    model, ema = FakeModel(), {"a": -0.2}
    generate_eval_images(model, spec, tmp_path / "ema", transformer=ema, **KW)
    assert all(t is ema for t in model.transformers_seen)
    generate_eval_images(FakeModel(), spec, tmp_path / "base", **KW)
    assert _pngs(tmp_path / "ema") != _pngs(tmp_path / "base")


def _simulated_ranks(model_factory, specs, out_root, step, world_size, **kw):
    """Run run_unigenbench_eval for ``world_size`` ranks in threads; gather_fn is a real all-gather (a barrier) that
    round-trips through JSON like the trainer's ``dist.all_gather_json``."""
    payloads: dict[int, object] = {}
    sync = threading.Barrier(world_size, timeout=60)
    barriers, results, errors = [], [None] * world_size, []

    def make_gather(rank):
        def gather(obj):
            payloads[rank] = json.loads(json.dumps(obj))
            sync.wait()
            return [payloads[r] for r in range(world_size)]
        return gather

    def barrier():
        barriers.append(1)
        sync.wait()

    def run(rank):
        try:
            results[rank] = run_unigenbench_eval(model_factory(), specs, out_root, step, rank=rank,
                                                 world_size=world_size, gather_fn=make_gather(rank),
                                                 barrier_fn=barrier, **kw)
        except BaseException as exc:  # surfaced below
            errors.append(exc)
            sync.abort()

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world_size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results, payloads, barriers


def test_run_unigenbench_eval_two_ranks_with_judge(tmp_path, fake_judge):
    specs = load_eval_config(DEMO_YAML)
    specs[0].num_inference_steps = specs[1].num_inference_steps = 2
    ub = specs[0]
    for i, p in enumerate(ub.prompts):  # judge: every test point right except the last one of odd prompts
        n = len(p.testpoints)
        fake_judge.table[p.prompt] = ("ok", str([1] * (n - 1) + [0 if i % 2 else 1]))
    cfg = JudgeConfig(api_url=fake_judge.url, workers=4, timeout=5, max_retries=1, backoff=0.01)
    results, payloads, barriers = _simulated_ranks(FakeModel, specs, tmp_path, 10, 2, judge=True, judge_config=cfg,
                                                   height=32, width=32, batch_size=4, progress=False)
    assert results[0] == results[1]
    metrics = results[0]
    # each rank judged only its own images
    assert sum(fake_judge.requests.values()) == 12
    assert [len(p[1]) for p in payloads.values()] == [6, 6]
    total = sum(len(p.testpoints) for p in ub.prompts) * 2
    wrong = sum(1 for i in range(6) if i % 2) * 2
    assert metrics["eval/demo_unigenbench/testpoint_micro_acc"] == pytest.approx((total - wrong) / total)
    assert "eval/demo_unigenbench/overall" not in metrics  # the demo set does not cover all 10 primaries
    assert metrics["eval/demo_unigenbench/success_rate"] == 1.0
    assert metrics["eval/demo_unigenbench/num_images"] == 12 and metrics["eval/demo_txt/num_images"] == 3
    style = [(i, k == len(p.testpoints) - 1) for i, p in enumerate(ub.prompts)
             for k, tp in enumerate(p.testpoints) if tp.primary == "Style"]
    style_ok = sum(0 if (last and i % 2) else 1 for i, last in style)
    assert metrics["eval/demo_unigenbench/primary/Style"] == pytest.approx(style_ok / len(style))
    assert "eval/demo_unigenbench/sub/Action - Hand (Character_Anthropomorphic)" in metrics
    assert len(barriers) == 2
    step_dir = tmp_path / "step_10"
    assert len(list((step_dir / "demo_unigenbench").glob("*.png"))) == 12
    assert len(list((step_dir / "demo_txt").glob("*.png"))) == 3
    summary = json.loads((step_dir / "unigenbench_summary.json").read_text())
    assert summary["demo_unigenbench"]["num_judged"] == 12 and summary["demo_txt"]["num_images"] == 3
    s = summary["demo_unigenbench"]
    assert s["protocol"]["template"]["kind"] == "project" and s["leaderboard_comparable"] is False
    assert s["image_size"] == [{"height": 32, "width": 32, "num_images": 12}]
    html = (step_dir / "index.html").read_text()
    assert "src='demo_unigenbench/5.1.png'" in html and "src='demo_txt/2.0.png'" in html
    assert (step_dir / "unigenbench_dimensions.csv").is_file()


def test_run_unigenbench_eval_unreachable_judge_does_not_crash(tmp_path):
    specs = load_eval_config(DEMO_YAML)[:1]
    specs[0].num_inference_steps, specs[0].duplicates = 1, 1
    cfg = JudgeConfig(api_url=f"http://127.0.0.1:{free_port()}", timeout=1, max_retries=3)
    metrics = run_unigenbench_eval(FakeModel(), specs, tmp_path, 3, judge=True, judge_config=cfg,
                                   height=16, width=16, progress=False)
    assert metrics["eval/demo_unigenbench/num_failed"] == 6 and metrics["eval/demo_unigenbench/success_rate"] == 0
    assert "eval/demo_unigenbench/testpoint_micro_acc" not in metrics
    s = json.loads((tmp_path / "step_3" / "unigenbench_summary.json").read_text())["demo_unigenbench"]
    assert s["num_request_failed"] == 6 and "unreachable" in s["failures"][0]["error"]


def test_run_without_judge_only_generates(tmp_path):
    specs = load_eval_config(DEMO_YAML)
    for s in specs:
        s.num_inference_steps, s.duplicates = 1, 1
    metrics = run_unigenbench_eval(FakeModel(), specs, tmp_path, 0, judge=False, height=16, width=16,
                                   progress=False)
    assert metrics == {"eval/demo_unigenbench/num_images": 6.0, "eval/demo_txt/num_images": 3.0}
    assert (tmp_path / "step_0" / "index.html").is_file()


def test_spec_dataclass_defaults():
    spec = EvalDatasetSpec(name="x", path=Path("x.txt"), prompts=[])
    assert (spec.cfg_scale, spec.num_inference_steps, spec.duplicates, spec.language) == (4.0, 50, 4, None)


def test_sde_mode_adds_per_item_noise(tmp_path):
    spec = _spec(steps=4)
    generate_eval_images(FakeModel(), spec, tmp_path / "ode", inference_mode="ode", **KW)
    generate_eval_images(FakeModel(), spec, tmp_path / "sde", inference_mode="sde", eta=0.7, **KW)
    generate_eval_images(FakeModel(), spec, tmp_path / "eta0", inference_mode="sde", eta=0.0, **KW)
    ode, sde = _pngs(tmp_path / "ode"), _pngs(tmp_path / "sde")
    assert all(ode[k] != sde[k] for k in ode)
    assert _pngs(tmp_path / "eta0") == ode  # cps_sde with eta = 0 is the Euler step
    with pytest.raises(ValueError, match="inference_mode"):
        generate_eval_images(FakeModel(), spec, tmp_path / "x", inference_mode="euler", **KW)


def test_per_dataset_resolution_is_used_and_recorded(tmp_path, fake_judge):
    specs = load_eval_config(DEMO_YAML)
    for s in specs:
        s.num_inference_steps, s.duplicates = 1, 1
    specs[0].height, specs[0].width = 48, 32  # demo_unigenbench at 32x48 (w x h); demo_txt at the caller's 16x16
    for p in specs[0].prompts:
        fake_judge.table[p.prompt] = ("ok", [1] * len(p.testpoints))
    cfg = JudgeConfig(api_url=fake_judge.url, workers=2, timeout=5, max_retries=0)
    run_unigenbench_eval(FakeModel(), specs, tmp_path, 1, judge_config=cfg, height=16, width=16, progress=False)
    step = tmp_path / "step_1"
    assert Image.open(step / "demo_unigenbench" / "0.0.png").size == (32, 48)
    assert Image.open(step / "demo_txt" / "0.0.png").size == (16, 16)
    summary = json.loads((step / "unigenbench_summary.json").read_text())
    assert summary["demo_unigenbench"]["image_size"] == [{"height": 48, "width": 32, "num_images": 6}]
    assert summary["demo_txt"]["image_size"] == [{"height": 16, "width": 16, "num_images": 3}]
    assert summary["demo_unigenbench"]["testpoint_micro_acc"] == 1.0
