"""DeepGen model properties: fused layers, batch-invariant conditioning, velocity, VAE round trip, freezing."""

import copy
import math

import pytest
import torch
from diffusers.models.attention_processor import JointAttnProcessor2_0

from tests.models.paths import TINY_CONFIG
from deepgen_rl.models import Conditioning, build_model, fused_layer_indices

LONG = "a much longer prompt about a white horse beside a brown fence on a green field at sunset"


def test_fused_layers_count_back_from_second_to_last_layer():
    assert fused_layer_indices(36) == [35, 29, 23, 17, 11, 5]
    assert fused_layer_indices(13) == [12, 6]
    assert fused_layer_indices(7) == [6]
    assert fused_layer_indices(8) == [7, 1]
    for n in range(2, 80):
        idx = fused_layer_indices(n)
        assert len(idx) == math.ceil((n - 1) / 6)
        assert idx[0] == n - 1 and min(idx) >= 1 and all(a - b == 6 for a, b in zip(idx, idx[1:]))


def test_tiny_model_size_and_shapes(tiny_model):
    m = tiny_model
    assert sum(p.numel() for p in m.parameters()) < 10_000_000
    assert m.fused_layers == [12, 6]
    assert m.projector_1.in_features == 2 * m.lmm.config.get_text_config().hidden_size
    assert m.latent_shape(64, 96) == (16, 8, 12)
    assert m.scheduler_shift == 3.0
    cond = m.encode_prompts(["a red cat", LONG])
    lengths = m._tokenize(["a red cat", LONG])[1]
    seq_len = int(lengths.max()) + m.num_queries  # padded to the batch's longest prompt, not max_prompt_tokens
    assert int(lengths.max()) < m.max_prompt_tokens
    assert cond.prompt_embeds.shape == (2, seq_len, m.transformer.config.joint_attention_dim)
    assert cond.text_mask.tolist() == [[True] * (n + m.num_queries) + [False] * (seq_len - n - m.num_queries)
                                       for n in lengths.tolist()]
    assert cond.pooled_embeds.shape == (2, m.transformer.config.pooled_projection_dim)


def test_conditioning_is_batch_invariant(tiny_model):
    alone = tiny_model.encode_prompts(["a"])
    for batch, pos in ((["a", LONG], 0), ([LONG, "a"], 1), ([LONG, "b", "a", LONG + " again"], 2)):
        mixed = tiny_model.encode_prompts(batch)[pos].trimmed()  # its own n + Q rows, no mask left
        assert mixed.text_mask is None and alone.text_mask.all()
        torch.testing.assert_close(mixed.prompt_embeds, alone.prompt_embeds, atol=1e-5, rtol=0)
        torch.testing.assert_close(mixed.pooled_embeds, alone.pooled_embeds, atol=1e-5, rtol=0)


def test_pad_positions_are_zero_and_think_tokens_follow_prompt(tiny_model):
    m = tiny_model
    ids, lengths = m._tokenize(["a", LONG])
    cond = m.encode_prompts(["a", LONG])
    for row, n in enumerate(lengths.tolist()):
        valid = n + m.num_queries
        assert torch.equal(cond.prompt_embeds[row, valid:], torch.zeros_like(cond.prompt_embeds[row, valid:]))
        assert cond.prompt_embeds[row, :valid].abs().amin(dim=-1).gt(0).all()
        assert cond.text_mask[row].tolist() == [True] * valid + [False] * (cond.text_mask.shape[1] - valid)
    assert not cond.text_mask[0].all() and cond.text_mask[1].all()  # "a" is padded, LONG is the longest


def test_think_tokens_follow_the_prompt_with_continuing_text_positions(tiny_model):
    m = tiny_model
    seen = {}
    text_model = m._text_model()
    hook = text_model.register_forward_pre_hook(lambda mod, args, kwargs: seen.update(kwargs), with_kwargs=True)
    try:
        m.encode_prompts(["a", LONG])
    finally:
        hook.remove()
    lengths = m._tokenize(["a", LONG])[1]
    q = m.num_queries
    for row, n in enumerate(lengths.tolist()):
        assert torch.equal(seen["inputs_embeds"][row, n:n + q], m.meta_queries)
        pos = seen["position_ids"][:, row, : n + q]
        assert torch.equal(pos, torch.arange(n + q).expand(3, -1))  # same position on all 3 mRoPE axes
        longest = int(lengths.max())
        assert seen["attention_mask"][row].tolist() == [1] * (n + q) + [0] * (longest - n)


def test_padding_does_not_change_the_valid_tokens(tiny_model):
    """Unpadded reference computation ([prompt][think], no masks) equals our padded one on the valid tokens."""
    m = tiny_model
    ids, lengths = m._tokenize([LONG])
    n, q = int(lengths[0]), m.num_queries
    with torch.no_grad():
        embeds = torch.cat([m.lmm.get_input_embeddings()(ids[:, :n]), m.meta_queries[None]], dim=1)
        out = m._text_model()(inputs_embeds=embeds, position_ids=torch.arange(n + q).expand(3, 1, -1),
                              use_cache=False, output_hidden_states=True)
        x = m.connector(m.projector_1(torch.cat([out.hidden_states[i] for i in m.fused_layers], dim=-1)))
        ref_seq, ref_pooled = m.projector_3(x), m.projector_2(x.mean(1))
    cond = m.encode_prompts([LONG])
    torch.testing.assert_close(cond.prompt_embeds[:, : n + q], ref_seq, atol=1e-5, rtol=0)
    torch.testing.assert_close(cond.pooled_embeds, ref_pooled, atol=1e-5, rtol=0)


def test_long_prompts_are_truncated_keeping_the_template_tail(tiny_model):
    m = copy.copy(tiny_model)  # shallow: own counter, shared weights
    m.num_truncated_prompts = 0
    very_long = " ".join(["a red apple on a wooden table"] * 30)
    ids, lengths = m._tokenize(["a cat", very_long])
    assert lengths[1] == m.max_prompt_tokens and m.num_truncated_prompts == 1 and ids.shape[1] == m.max_prompt_tokens
    tail = m.tokenizer("<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    assert ids[1, -len(tail):].tolist() == tail
    assert ids[0, lengths[0] - len(tail):lengths[0]].tolist() == tail


def test_conditioning_matters_with_trained_projectors(tiny_model):
    torch.manual_seed(0)
    latents = torch.randn(2, *tiny_model.latent_shape(64, 64))
    sigma = torch.full((2,), 0.7)
    a = tiny_model.encode_prompts(["a red apple on a table"])
    b = tiny_model.encode_prompts(["two dogs run across a field"])
    with torch.no_grad():
        va = tiny_model.predict_velocity(latents, sigma, Conditioning.cat([a, a]))
        vb = tiny_model.predict_velocity(latents, sigma, Conditioning.cat([b, b]))
    assert (va - vb).abs().max() > 1e-3


def test_fresh_zero_projectors_make_conditioning_prompt_independent():
    model = build_model(TINY_CONFIG, default_checkpoint=None)
    cond = model.encode_prompts(["a red apple on a table", LONG])
    lengths = model._tokenize(["a red apple on a table", LONG])[1]
    for row, n in enumerate(lengths.tolist()):
        valid = n + model.num_queries
        # zero weights: every valid token is exactly the (zero) bias, pads are zero.
        assert torch.equal(cond.prompt_embeds[row, :valid],
                           model.projector_3.bias.expand(valid, -1))
        assert torch.equal(cond.prompt_embeds[row, valid:], torch.zeros_like(cond.prompt_embeds[row, valid:]))
        assert torch.equal(cond.pooled_embeds[row], model.projector_2.bias)
    # The DiT sees only the n + Q real rows (all equal to the bias), so the velocity follows the prompt's length
    # alone: it equals the plain DiT fed n + Q copies of the bias.
    latents = torch.randn(1, *model.latent_shape(64, 64)).expand(2, -1, -1, -1)
    with torch.no_grad():
        v = model.predict_velocity(latents, torch.full((2,), 0.5), cond)
        for row, n in enumerate(lengths.tolist()):
            plain = copy.deepcopy(model.transformer)
            plain.set_attn_processor(JointAttnProcessor2_0())  # diffusers' own attention processor, no mask
            ref = plain(hidden_states=latents[:1], encoder_hidden_states=model.projector_3.bias.expand(1, n + model.num_queries, -1),
                        pooled_projections=model.projector_2.bias[None], timestep=torch.full((1,), 500.0),
                        return_dict=False)[0]
            torch.testing.assert_close(v[row:row + 1], ref, atol=1e-5, rtol=0)


def test_predict_velocity_timestep_dtype_and_override(tiny_model):
    m = tiny_model
    torch.manual_seed(1)
    latents = torch.randn(3, *m.latent_shape(64, 64))
    sigma = torch.tensor([1.0, 0.5, 0.1])
    cond = m.encode_prompts(["a", "b", "c"])
    seen = {}
    hook = m.transformer.register_forward_pre_hook(
        lambda mod, args, kwargs: seen.update(t=kwargs["timestep"].clone()), with_kwargs=True)
    try:
        with torch.no_grad():
            v = m.predict_velocity(latents, sigma, cond)
    finally:
        hook.remove()
    torch.testing.assert_close(seen["t"], sigma * 1000)
    assert v.shape == latents.shape and v.dtype == torch.float32

    bf16_dit = copy.deepcopy(m.transformer).to(torch.bfloat16)
    with torch.no_grad():
        v_bf16 = m.predict_velocity(latents, sigma, cond, transformer=bf16_dit)
    assert v_bf16.dtype == torch.float32
    assert (v_bf16 - v).abs().max() < 0.1 * v.abs().max()
    with torch.no_grad():
        v_half_latents = m.predict_velocity(latents.to(torch.bfloat16), sigma, cond)
    assert v_half_latents.dtype == torch.bfloat16


def test_decode_encode_shapes_range_and_determinism(tiny_model):
    m = tiny_model
    torch.manual_seed(2)
    latents = torch.randn(2, *m.latent_shape(64, 32))
    images = m.decode_latents(latents)
    assert images.shape == (2, 3, 64, 32) and images.dtype == torch.float32
    assert images.min() >= 0 and images.max() <= 1
    z1, z2 = m.encode_images(images), m.encode_images(images)
    assert z1.shape == latents.shape and torch.equal(z1, z2)
    z3 = m.encode_images(images, generator=torch.Generator().manual_seed(0))
    assert not torch.equal(z1, z3)
    # z = (mean(E(x)) - shift) * scale
    cfg = m.vae.config
    mean = m.vae.encode(images * 2 - 1).latent_dist.mean
    torch.testing.assert_close(z1, (mean - cfg.shift_factor) * cfg.scaling_factor)


def test_only_the_dit_trains(tiny_model):
    m = build_model(TINY_CONFIG)
    dit_ids = {id(p) for p in m.transformer.parameters()}
    assert {id(p) for p in m.trainable_parameters()} == dit_ids
    assert {id(p) for p in m.parameters() if p.requires_grad} == dit_ids
    m.train()
    assert m.transformer.training and not m.lmm.training and not m.connector.training and not m.vae.training
    m.enable_gradient_checkpointing()
    cond = m.encode_prompts(["a red cat"])
    assert not cond.prompt_embeds.requires_grad
    v = m.predict_velocity(torch.randn(1, *m.latent_shape(64, 64)), torch.tensor([0.5]), cond)
    v.square().mean().backward()
    grads = [p.grad for p in m.transformer.parameters()]
    assert all(g is not None for g in grads) and any(g.abs().sum() > 0 for g in grads)
    assert all(p.grad is None for n, p in m.named_parameters() if not n.startswith("transformer."))


def test_conditioning_helpers():
    cond = Conditioning(torch.arange(24.0).view(3, 4, 2), torch.arange(6.0).view(3, 2))
    assert len(cond) == 3
    assert torch.equal(cond[1].prompt_embeds, cond.prompt_embeds[1:2])
    assert torch.equal(cond[-1].pooled_embeds, cond.pooled_embeds[2:])
    assert torch.equal(cond[[2, 0]].pooled_embeds, cond.pooled_embeds[[2, 0]])
    sel = cond.index_select(torch.tensor([0, 0, 2]))
    assert torch.equal(sel.prompt_embeds, cond.prompt_embeds[[0, 0, 2]])
    rep = cond.repeat_interleave(2)
    assert torch.equal(rep.pooled_embeds[:, 0], torch.tensor([0.0, 0, 2, 2, 4, 4]))
    both = Conditioning.cat([cond, cond[0]])
    assert len(both) == 4 and torch.equal(both.prompt_embeds[3], cond.prompt_embeds[0])
    half = cond.to(dtype=torch.bfloat16)
    assert half.prompt_embeds.dtype == half.pooled_embeds.dtype == torch.bfloat16
    with pytest.raises(ValueError):
        Conditioning(torch.zeros(2, 4, 2), torch.zeros(3, 2))
