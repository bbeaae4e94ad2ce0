"""The pre-trained toy DeepGen: real classes and loading path, deterministic build, and it draws what it is asked."""

from __future__ import annotations

import json
import os

import pytest
import torch

from deepgen_rl.toy.datasets import eval_heldout_specs, eval_train_specs
from deepgen_rl.toy.evaluate import check_images, summarize
from deepgen_rl.toy.model import VARIANT_NAMES
from deepgen_rl.toy.sampling import evaluate_prompts
from deepgen_rl.toy.world import caption


def test_toy_model_uses_the_real_classes_and_sft_layout(toy_model_paths, toy_model):
    from diffusers import AutoencoderKL, SD3Transformer2DModel
    from transformers import Qwen2_5_VLForConditionalGeneration

    from deepgen_rl.checkpoints.sft import read_checkpoint

    assert isinstance(toy_model.lmm, Qwen2_5_VLForConditionalGeneration)
    assert isinstance(toy_model.transformer, SD3Transformer2DModel)
    assert isinstance(toy_model.vae, AutoencoderKL)
    (report,) = toy_model.load_reports
    assert report.missing == [] and len(report.loaded) > 50
    raw = read_checkpoint(toy_model_paths["checkpoint"])
    assert any(k.startswith("lmm.model.layers.") and ".lora_" in k for k in raw)  # transformers-4.51 LoRA keys
    assert {"meta_queries", "projector_1.weight", "projector_3.weight"} <= set(raw)
    meta = json.loads(open(os.path.join(toy_model_paths["root"], "toy_meta.json")).read())
    assert meta["dit_final_loss"] < 0.6 * meta["dit_first_loss"]  # pre-training did fit


# Fingerprints of pinned builds (toy_meta.json): (vae_recon_strict, dit_final_loss), per variant and CPU vendor. The
# pinned numerics hold among the machines of one vendor, not across vendors (docs/toy_world.md, "A build on both cores;
# an Intel machine"): under MKL's plain AVX2 mode two AMD EPYCs (AVX2-only and AVX-512) built the same toy-v3 (68 / 128,
# 0.469067) and slots_wide_one_process (118 / 128, 0.128346), an Intel Xeon (AVX-512, AMX) another
# slots_wide_one_process (122 / 128, 0.130585). Only builds under the current pins (MKL strict mode, since 2026-12-07)
# are listed: slots_wide (two ranks) on the Intel Xeon (2026-12-07) and on an AMD EPYC with AVX-512 (2026-12-08, CI's
# fresh build, 848 s beside the other worker); another vendor's machine skips until one is measured there.
PINNED_FINGERPRINTS = {("slots_wide", "GenuineIntel"): (123 / 128, 0.126554),
                       ("slots_wide", "AuthenticAMD"): (125 / 128, 0.127812)}


def test_the_pinned_toy_build_is_the_documented_one(toy_model_paths):
    """With pinned numerics (deepgen_rl/toy/model.py, "Pinned numerics") the machines of one CPU vendor build the
    same model of a variant: the suite's build has its variant's documented fingerprint for this vendor."""
    from deepgen_rl.toy.model import PINNED_TAG, cpu_vendor, expected_numerics, meta_variant, read_meta

    meta = read_meta(toy_model_paths["root"])
    assert meta["numerics"] == expected_numerics()
    key = (meta_variant(meta), meta.get("cpu_vendor") or cpu_vendor())
    if expected_numerics() != PINNED_TAG or key not in PINNED_FINGERPRINTS:
        pytest.skip(f"no documented fingerprint for this build (variant, CPU vendor {key}, numerics "
                    f"{meta['numerics']})")
    recon, loss = PINNED_FINGERPRINTS[key]
    assert meta["vae_recon_strict"] == recon  # of the 128 reconstructions the build checks
    assert meta["dit_final_loss"] == pytest.approx(loss, abs=1e-5)
    assert meta["torch_threads"] == 1


def test_toy_build_is_deterministic_from_its_seed(tmp_path):
    """Two builds of a shortened config from the same seed write identical weights; another seed does not."""
    from deepgen_rl.checkpoints.sft import read_checkpoint
    from deepgen_rl.toy.model import TOY_CONFIG, make_toy_deepgen

    # dit_pool=0: fresh pairs every step (the pooled build is checked below)
    short = dict(TOY_CONFIG, vae_steps=2, vae_batch=2, vae_pool=8, dit_steps=3, dit_batch=4, dit_pool=0)
    a = read_checkpoint(make_toy_deepgen(str(tmp_path / "a"), progress=False, config=short)["checkpoint"])
    b = read_checkpoint(make_toy_deepgen(str(tmp_path / "b"), progress=False, config=short)["checkpoint"])
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    c = read_checkpoint(make_toy_deepgen(str(tmp_path / "c"), progress=False,
                                         config=dict(short, seed=1))["checkpoint"])
    assert not torch.equal(a["transformer.proj_out.weight"], c["transformer.proj_out.weight"])
    # A fixed pre-rendered pool (dit_pool) is as deterministic, and trains on other pairs than fresh sampling.
    pooled = dict(short, dit_pool=6)
    d = read_checkpoint(make_toy_deepgen(str(tmp_path / "d"), progress=False, config=pooled)["checkpoint"])
    e = read_checkpoint(make_toy_deepgen(str(tmp_path / "e"), progress=False, config=pooled)["checkpoint"])
    assert all(torch.equal(d[k], e[k]) for k in d)
    assert not torch.equal(a["transformer.proj_out.weight"], d["transformer.proj_out.weight"])


def test_toy_model_draws_what_it_is_asked(toy_model):
    """The issue's base targets, on the suite's model (`slots_wide`): ODE samples pass the checker on a clear majority
    of train-split prompts, held-out compositions have a strict accuracy of 20-60% (room for RL), and the images
    belong to their own prompts: checked against another prompt's claims they score far lower.

    Measured (1 image per prompt, 10 ODE steps): slots_wide (two ranks, pinned, Intel Xeon, 2026-12-07) train
    strict 0.781 / claim score 0.900; held-out 0.328 / 0.638; train images against shuffled prompts 0.016 / 0.158.
    slots_wide_one_process (AMD EPYC): 0.766 / 0.885, 0.281 / 0.567 and 0.016 / 0.150. With 64 prompts a strict
    accuracy near 0.3 carries about ±0.06 of evaluation noise; machines of one CPU vendor build the same model.
    The default variant (toy-v3, no longer built by the suite) had 0.094 / 0.509, 0.016 / 0.352 and 0.031 / 0.212:
    below the targets (docs/toy_world.md)."""
    train = [caption(s) for s in eval_train_specs()]
    held = [caption(s) for s in eval_heldout_specs()]
    images, verdicts = evaluate_prompts(toy_model, train, seed=0, duplicates=1, num_inference_steps=10)
    s_train = summarize([v.to_dict() for v in verdicts])
    _, hverdicts = evaluate_prompts(toy_model, held, seed=0, duplicates=1, num_inference_steps=10)
    s_held = summarize([v.to_dict() for v in hverdicts])
    shuffled = train[1:] + train[:1]
    s_shuf = summarize([v.to_dict() for v in check_images(images, shuffled)])
    print({k: (round(s["strict_acc"], 3), round(s["claim_score"], 3))
           for k, s in (("train", s_train), ("held_out", s_held), ("train images vs shuffled prompts", s_shuf))})
    assert s_train["strict_acc"] > 0.5 and s_train["claim_score"] >= 0.8
    assert 0.2 <= s_held["strict_acc"] <= 0.6
    assert s_held["claim_score"] < s_train["claim_score"] - 0.1
    assert s_shuf["claim_score"] < s_train["claim_score"] - 0.5


def test_x4_mean_vae_variant_builds_with_consistent_shapes_and_trains_the_lora(tmp_path):
    """The variant's x4 VAE (16x16 latents) and patch-2 DiT fit together (pre-training runs the DiT on the VAE's
    latents), its VAE follows the "mean" recipe, and train_lora moves the VLM LoRA tensors on the prompt's path (the
    same build with train_lora off leaves them all at their initial values)."""
    from deepgen_rl.checkpoints.sft import read_checkpoint
    from deepgen_rl.toy.model import TOY_CONFIG, VARIANTS, make_toy_deepgen, read_meta

    short = dict(vae_steps=2, vae_batch=2, vae_pool=4, dit_steps=2, dit_batch=2)
    x4 = make_toy_deepgen(str(tmp_path / "x4"), progress=False,
                          config={**TOY_CONFIG, **VARIANTS["x4_mean_vae"], **short})
    frozen = make_toy_deepgen(str(tmp_path / "frozen"), progress=False,
                              config={**TOY_CONFIG, **VARIANTS["x4_mean_vae"], **short, "train_lora": False})
    vae_cfg = json.loads(open(os.path.join(x4["sd3"], "vae", "config.json")).read())
    dit_cfg = json.loads(open(os.path.join(x4["sd3"], "transformer", "config.json")).read())
    assert vae_cfg["block_out_channels"] == [16, 32, 32] and dit_cfg["sample_size"] == 16
    assert dit_cfg["patch_size"] == 2 and dit_cfg["pos_embed_max_size"] == 8
    meta = read_meta(x4["root"])
    assert 0.0 <= meta["vae_recon_strict"] <= 1.0 and meta["vae_recon_mse"] > 0
    a, b = read_checkpoint(x4["checkpoint"]), read_checkpoint(frozen["checkpoint"])
    lora = [k for k in a if ".lora_" in k]
    assert lora, "the SFT checkpoint holds the VLM's LoRA"
    # same seed and init: only the LoRA-trained build moves the LoRA tensors
    moved = {k for k in lora if not torch.equal(a[k], b[k])}
    # the prompt's path: token embedding and language-model layers (not the vision tower, not lm_head); every LoRA
    # of layer 0 is on it
    first = {k for k in lora if k.startswith("lmm.model.layers.0.")}
    on_path = ("lmm.model.layers.", "lmm.model.embed_tokens.")
    assert first and first <= moved and all(k.startswith(on_path) for k in moved)


def test_toy_build_ema_is_the_closed_form_of_the_trained_weights(tmp_path):
    """With ``dit_ema`` the checkpoint holds the EMA: after one step of decay d it is d·w0 + (1 − d)·w1, w0 the DiT's
    initial weights (its saved random init) and w1 the weights the same build writes without the EMA."""
    from safetensors.torch import load_file

    from deepgen_rl.checkpoints.sft import read_checkpoint
    from deepgen_rl.toy.model import TOY_CONFIG, make_toy_deepgen

    one = dict(TOY_CONFIG, vae_steps=1, vae_batch=2, dit_steps=1, dit_batch=4, dit_pool=6)
    plain = make_toy_deepgen(str(tmp_path / "plain"), progress=False, config=one)
    w1 = read_checkpoint(plain["checkpoint"])
    w0 = load_file(os.path.join(plain["sd3"], "transformer", "diffusion_pytorch_model.safetensors"))
    ema = read_checkpoint(make_toy_deepgen(str(tmp_path / "ema"), progress=False,
                                           config=dict(one, dit_ema=0.75))["checkpoint"])
    key = "transformer.proj_out.weight"
    assert not torch.equal(w1[key], w0["proj_out.weight"])  # the step moved it
    for k in (key, "transformer.pos_embed.proj.weight", "transformer.transformer_blocks.0.attn.to_q.weight"):
        torch.testing.assert_close(ema[k], 0.75 * w0[k[len("transformer."):]] + 0.25 * w1[k], rtol=0, atol=1e-6)


@pytest.mark.parametrize("name", VARIANT_NAMES)
def test_every_variants_dit_maps_its_latents_and_a_context_of_its_width(name):
    """Without a build: each variant's DiT, as the build creates it, takes the VAE's 16-channel latents and a context
    of its joint_attention_dim and returns a finite velocity of the latents' shape (a width that does not match the
    attention heads, e.g. caption_projection_dim 64 with 3 heads of 32, fails here instead of minutes into a build)."""
    from deepgen_rl.toy.model import variant_config
    from deepgen_rl.toy.pretrain import random_toy_dit

    cfg = variant_config(name)
    torch.manual_seed(0)
    dit = random_toy_dit(cfg).eval()
    side = 64 // 2 ** (len(cfg["vae"]["block_out_channels"]) - 1)
    x = torch.randn(2, 16, side, side)
    ctx = torch.randn(2, 5, cfg["dit"]["joint_attention_dim"])
    with torch.no_grad():
        v = dit(hidden_states=x, encoder_hidden_states=ctx, pooled_projections=torch.randn(2, cfg["dit"][
            "pooled_projection_dim"]), timestep=torch.tensor([10.0, 900.0])).sample
    assert v.shape == x.shape and torch.isfinite(v).all()


@pytest.mark.parametrize("mode", ["random", "slots"])
def test_layout_and_object_size_reach_the_build_images_and_leave_the_world_range(tmp_path, monkeypatch, mode):
    """``layout`` picks the placement the build renders its images with (``world.layout`` or ``world.slot_layout``)
    and ``object_size`` their sizes (the world's own range is untouched); a bad range or layout is a clear error
    before anything is trained."""
    from deepgen_rl.toy import world
    from deepgen_rl.toy.model import TOY_CONFIG, VARIANTS, make_toy_deepgen

    seen = {"random": [], "slots": []}
    real = {"random": world.layout, "slots": world.slot_layout}

    def spy(name):
        def placed(spec, rng, sizes, *rest):
            out = real[name](spec, rng, sizes, *rest)
            seen[name].extend(p.size for p in out)
            return out
        return placed

    monkeypatch.setattr(world, "layout", spy("random"))
    monkeypatch.setattr(world, "slot_layout", spy("slots"))
    base = VARIANTS["slots"] if mode == "slots" else TOY_CONFIG  # the variant's own config (its "mean" VAE too)
    short = dict(base, vae_steps=1, vae_batch=2, vae_pool=4, dit_steps=1, dit_batch=4, dit_pool=4,
                 object_size=(24, 26), layout=mode)
    make_toy_deepgen(str(tmp_path / "big"), progress=False, config=short)
    other = "slots" if mode == "random" else "random"
    assert len(seen[mode]) >= 4 + 4 and all(24 <= s <= 26 for s in seen[mode]) and not seen[other]
    assert world.SIZE_RANGE == (14.0, 20.0)
    with pytest.raises(ValueError, match="object_size"):
        make_toy_deepgen(str(tmp_path / "bad"), progress=False, config=dict(short, object_size=(30, 40)))
    with pytest.raises(ValueError, match="layout 'grid'"):
        make_toy_deepgen(str(tmp_path / "bad2"), progress=False, config=dict(short, layout="grid"))
    assert world.SIZE_RANGE == (14.0, 20.0)


def test_a_model_dir_loads_through_build_model_and_the_eval_cli(tmp_path, capsys):
    """A toy model built elsewhere (a variant, ``--out``) loads by ``model_dir_overrides`` / ``eval_cli --model_dir``
    with its own weights; a folder that is not a built toy model is a one-line error naming the build command."""
    from deepgen_rl.checkpoints.sft import read_checkpoint
    from deepgen_rl.models import build_model
    from deepgen_rl.toy.eval_cli import main
    from deepgen_rl.toy.model import TOY_CONFIG, make_toy_deepgen, model_dir_overrides
    from deepgen_rl.toy.rl_run import TOY_MODEL_CONFIG

    root = str(tmp_path / "variant")
    paths = make_toy_deepgen(root, progress=False,
                             config=dict(TOY_CONFIG, vae_steps=1, vae_batch=2, dit_steps=1, dit_batch=4, dit_pool=4))
    model = build_model(TOY_MODEL_CONFIG, **model_dir_overrides(root))
    raw = read_checkpoint(paths["checkpoint"])
    assert torch.equal(model.transformer.proj_out.weight, raw["transformer.proj_out.weight"])
    assert torch.equal(model.meta_queries, raw["meta_queries"])

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "a red circle"}\n')
    (tmp_path / "eval.yaml").write_text("datasets:\n  - name: toy_one\n    path: p.jsonl\n    cfg_scale: 0\n"
                                        "    num_inference_steps: 2\n    duplicates: 1\n    scoring: toy\n")
    out = tmp_path / "out"
    assert main(["--output_dir", str(out), "--model_dir", root, "--eval_dataset_config",
                 str(tmp_path / "eval.yaml")]) == 0
    assert (out / "step_0" / "toy_summary.json").is_file()
    with pytest.raises(SystemExit):
        main(["--output_dir", str(out), "--model_dir", str(tmp_path / "nothing")])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "is not a built toy model" in err and "--variant NAME --out" in err
