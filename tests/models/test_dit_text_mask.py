"""Pad text rows never reach the DiT: every image's velocity equals the DiT fed only its prompt's n + Q rows alone.

The reference for each image is diffusers' own ``SD3Transformer2DModel`` with its stock ``JointAttnProcessor2_0``
(no mask), fed the conditioning of that image's prompt encoded ALONE (exactly n + Q rows, no pads). Every DiT call of
the rollout, the policy loss (policy DiT, frozen reference DiT) and evaluation is recorded and checked row by row.
Here the trained DiT is a plain copy; the same check through real DeepSpeed engines (ZeRO-2, ZeRO-3) and the EMA DiT
that evaluation uses is tests/models/test_dit_text_mask_deepspeed.py.
"""

import copy
from types import SimpleNamespace

import pytest
import torch

from deepgen_rl.evaluation.config import EvalDatasetSpec, EvalPrompt
from deepgen_rl.evaluation.generate import generate_eval_images
from deepgen_rl.models import Conditioning
from deepgen_rl.models.deepgen.dit_attention import TextMaskedJointAttnProcessor
from deepgen_rl.rl.samplers import make_sigmas
from deepgen_rl.rollout import rollout
from deepgen_rl.trainer.policy import PieceInputs, policy_piece_loss
from tests.models.text_mask_checks import ATOL, PROMPTS, Recorder, compare_with_alone, encode_alone
from tests.models.text_mask_checks import plain_dit as _plain_dit


@pytest.fixture(scope="module")
def alone(tiny_model):
    """prompt -> its Conditioning encoded alone (n + Q rows, all real)."""
    return encode_alone(tiny_model)


def check_against_alone(model, calls, alone, min_masked_calls=1):
    """Every recorded row equals the plain DiT (same weights) fed only the matching prompt's own rows."""
    plain_cache = {}

    def reference_for(transformer):
        dit = model.transformer if transformer is None else transformer
        return plain_cache.setdefault(id(dit), _plain_dit(dit))

    result = compare_with_alone(calls, alone, reference_for)
    assert result["max_abs_diff"] <= ATOL, result
    assert result["masked_calls"] >= min_masked_calls, "no call mixed prompt lengths: the test would prove nothing"


def test_conditioning_carries_its_mask_through_batch_ops():
    a = Conditioning(torch.randn(2, 3, 4), torch.randn(2, 5), torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool))
    b = Conditioning(torch.randn(1, 5, 4), torch.randn(1, 5))  # no mask: all 5 rows real
    both = Conditioning.cat([a, b])
    assert both.prompt_embeds.shape == (3, 5, 4)
    assert both.text_mask.tolist() == [[1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]
    assert torch.equal(both.prompt_embeds[:2, 3:], torch.zeros(2, 2, 4))
    assert torch.equal(both.prompt_embeds[:2, :3], a.prompt_embeds)
    sel = both.index_select([2, 0])
    assert sel.text_mask.tolist() == [[1] * 5, [1, 1, 0, 0, 0]]
    assert both[0].text_mask.tolist() == [[1, 1, 0, 0, 0]] and both[-1].text_mask.tolist() == [[1] * 5]
    assert both[[1]].text_mask.tolist() == [[1, 1, 1, 0, 0]]
    assert both.repeat_interleave(2).text_mask[:, 2].tolist() == [0, 0, 1, 1, 1, 1]
    moved = both.to(dtype=torch.bfloat16)
    assert moved.text_mask.dtype == torch.bool and moved.prompt_embeds.dtype == torch.bfloat16
    trimmed = both[:2].trimmed()
    assert trimmed.prompt_embeds.shape == (2, 3, 4) and trimmed.text_mask.tolist() == [[1, 1, 0], [1, 1, 1]]
    assert both[1].trimmed().text_mask is None and both[1].trimmed().prompt_embeds.shape == (1, 3, 4)
    with pytest.raises(ValueError, match="text_mask"):
        Conditioning(torch.zeros(2, 4, 2), torch.zeros(2, 2), torch.ones(2, 3, dtype=torch.bool))


def test_masked_processor_equals_unpadded_dit_on_random_pads(tiny_model):
    """Pads filled with large random values (not zeros) still change nothing: they are masked, not just small."""
    torch.manual_seed(0)
    cond = tiny_model.encode_prompts(PROMPTS)
    garbage = torch.where(cond.text_mask[..., None], cond.prompt_embeds, 100 * torch.randn_like(cond.prompt_embeds))
    noisy = Conditioning(garbage, cond.pooled_embeds, cond.text_mask)
    latents = torch.randn(3, *tiny_model.latent_shape(64, 64))
    sigma = torch.tensor([0.9, 0.5, 0.2])
    with torch.no_grad():
        v = tiny_model.predict_velocity(latents, sigma, noisy)
        plain = _plain_dit(tiny_model.transformer)
        unmasked = plain(hidden_states=latents, encoder_hidden_states=garbage, pooled_projections=cond.pooled_embeds,
                         timestep=sigma * 1000, return_dict=False)[0]
    assert isinstance(tiny_model.transformer.transformer_blocks[0].attn.processor, TextMaskedJointAttnProcessor)
    assert (unmasked - v).abs().max() > 1e-2  # the pads would matter if they were not masked
    for i, p in enumerate(PROMPTS):
        ref_cond = tiny_model.encode_prompts([p])
        with torch.no_grad():
            ref = plain(hidden_states=latents[i:i + 1], encoder_hidden_states=ref_cond.prompt_embeds,
                        pooled_projections=ref_cond.pooled_embeds, timestep=sigma[i:i + 1] * 1000,
                        return_dict=False)[0]
        torch.testing.assert_close(v[i:i + 1], ref, atol=ATOL, rtol=0)


@pytest.mark.parametrize("cfg_scale", [0.0, 4.5])
def test_rollout_and_policy_loss_velocities_equal_each_prompt_alone(tiny_model, alone, monkeypatch, cfg_scale):
    items = [SimpleNamespace(prompt=p, dataset="d", group_id=g, prompt_index=g) for g, p in enumerate(PROMPTS)]
    rec = Recorder(tiny_model, monkeypatch.setattr)
    sigmas = make_sigmas(2, tiny_model.scheduler_shift)
    batch = rollout(tiny_model, items, rollout_n=2, micro_batch_size=4, sigmas=sigmas,
                    stochastic=torch.ones(2, dtype=torch.bool), sampler="cps_sde", eta=1.0, cfg_scale=cfg_scale,
                    height=64, width=64, seed=0, step=0, rank=0)
    assert len(rec.calls) == 2 * 2  # 2 micro-batches x 2 steps, CFG branches batched into one forward
    check_against_alone(tiny_model, rec.calls, alone, min_masked_calls=2)  # micro-batch 1 mixes lengths

    # Training: the policy loss path on a separate DiT (as a DeepSpeed engine's module) with gradient
    # checkpointing and grads on, plus the frozen reference DiT for the KL term.
    rec.calls.clear()
    policy_dit = copy.deepcopy(tiny_model.transformer).train()
    policy_dit.enable_gradient_checkpointing()
    ref_dit = copy.deepcopy(tiny_model.transformer).eval()
    inputs = PieceInputs(model=tiny_model, transformer=policy_dit, ref_transformer=ref_dit, device=torch.device("cpu"),
                         dtype=next(policy_dit.parameters()).dtype, step=0, rank=0, seed=0, algorithm="flowgrpo",
                         sampler="cps_sde", eta=1.0, cfg_scale=cfg_scale, clip_range=1e-4, beta=0.1,
                         kl_type="v-based", adv_clip_max=5.0, nft_beta=0.1)
    loss, _ = policy_piece_loss(inputs, batch, torch.randn(len(batch)), [1, 2, 4], 0)
    loss.backward()
    assert {id(c[3]) for c in rec.calls} == {id(policy_dit), id(ref_dit)}
    assert all(p.grad is not None for p in policy_dit.parameters() if p.requires_grad)
    check_against_alone(tiny_model, rec.calls, alone, min_masked_calls=2)


@pytest.mark.parametrize("cfg_scale", [1.0, 4.0])
def test_evaluation_velocities_equal_each_prompt_alone(tiny_model, alone, monkeypatch, tmp_path, cfg_scale):
    rec = Recorder(tiny_model, monkeypatch.setattr)
    spec = EvalDatasetSpec(name="mix", path=tmp_path / "mix.txt",
                           prompts=[EvalPrompt(i, p) for i, p in enumerate(PROMPTS)], cfg_scale=cfg_scale,
                           num_inference_steps=2, duplicates=1)
    records = generate_eval_images(tiny_model, spec, tmp_path, height=64, width=64, batch_size=3, progress=False)
    assert len(records) == 3 and len(rec.calls) == 2
    check_against_alone(tiny_model, rec.calls, alone, min_masked_calls=2)
