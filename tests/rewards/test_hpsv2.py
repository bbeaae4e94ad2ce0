"""hpsv2: a tiny random open_clip-format checkpoint (the published format: {"state_dict": ...} with OpenAI-style
keys) loaded through the real path (converted to CLIPModel) and checked against an independent re-implementation of
the open_clip CLIP forward built from torch.nn.MultiheadAttention, as open_clip itself uses."""
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from deepgen_rl.rewards import get_reward
from deepgen_rl.rewards.open_clip_convert import convert_state_dict, main as convert_main
from deepgen_rl.rewards.testing import build_tiny_clip, random_open_clip_state

TEXT_W, VIS_W, PATCH, LAYERS, CTX = 32, 48, 8, 2, 77  # the shapes random_open_clip_state builds
TEXT_HEADS, VIS_HEADS = 2, 3


def reference_tower(state, prefix, x, heads, causal):
    width = x.shape[-1]
    mask = torch.full((x.shape[1], x.shape[1]), float("-inf")).triu(1) if causal else None
    for b in range(LAYERS):
        p = f"{prefix}.resblocks.{b}."
        attn = torch.nn.MultiheadAttention(width, heads, batch_first=True)
        attn.load_state_dict({"in_proj_weight": state[p + "attn.in_proj_weight"],
                              "in_proj_bias": state[p + "attn.in_proj_bias"],
                              "out_proj.weight": state[p + "attn.out_proj.weight"],
                              "out_proj.bias": state[p + "attn.out_proj.bias"]})
        h = F.layer_norm(x, (width,), state[p + "ln_1.weight"], state[p + "ln_1.bias"])
        x = x + attn(h, h, h, need_weights=False, attn_mask=mask)[0]
        h = F.layer_norm(x, (width,), state[p + "ln_2.weight"], state[p + "ln_2.bias"])
        h = F.gelu(F.linear(h, state[p + "mlp.c_fc.weight"], state[p + "mlp.c_fc.bias"]))
        x = x + F.linear(h, state[p + "mlp.c_proj.weight"], state[p + "mlp.c_proj.bias"])
    return x


@torch.no_grad()
def reference_scores(state, pixels, input_ids, eos_id):
    x = F.conv2d(pixels, state["visual.conv1.weight"], stride=PATCH).flatten(2).transpose(1, 2)
    x = torch.cat([state["visual.class_embedding"].expand(x.shape[0], 1, -1), x], 1) + state[
        "visual.positional_embedding"]
    x = F.layer_norm(x, (VIS_W,), state["visual.ln_pre.weight"], state["visual.ln_pre.bias"])
    x = reference_tower(state, "visual.transformer", x, VIS_HEADS, causal=False)
    image = F.layer_norm(x[:, 0], (VIS_W,), state["visual.ln_post.weight"], state["visual.ln_post.bias"]) @ state[
        "visual.proj"]
    t = state["token_embedding.weight"][input_ids] + state["positional_embedding"]
    t = reference_tower(state, "transformer", t, TEXT_HEADS, causal=True)
    t = F.layer_norm(t, (TEXT_W,), state["ln_final.weight"], state["ln_final.bias"])
    eot = (input_ids == eos_id).int().argmax(-1)  # open_clip pools at EOT (the highest id in the real BPE vocab)
    text = t[torch.arange(t.shape[0]), eot] @ state["text_projection"]
    return F.cosine_similarity(image, text, dim=-1)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("hps")
    processor_dir = build_tiny_clip(root / "processor")  # tokenizer + 32 px image processor
    from transformers import AutoTokenizer

    vocab = len(AutoTokenizer.from_pretrained(processor_dir))
    state = random_open_clip_state(vocab)
    checkpoint = root / "HPS_v2.1_tiny.pt"
    torch.save({"state_dict": state}, checkpoint)
    return str(checkpoint), processor_dir, state


PROMPTS = ["a photo of a cat", "a red car left of a bench", "green", "the blue dog", "a sign"]


def images(n):
    return [Image.new("RGB", (36 + 4 * i, 40), ((60 * i) % 256, 100 + 20 * i, 200 - 30 * i)) for i in range(n)]


def test_hpsv2_matches_independent_open_clip_forward(setup):
    from transformers import AutoImageProcessor, AutoTokenizer

    checkpoint, processor_dir, state = setup
    out = get_reward("hpsv2", model_path=checkpoint, processor_name_or_path=processor_dir, text_heads=TEXT_HEADS,
                     vision_heads=VIS_HEADS, batch_size=2)(images(5), PROMPTS)
    tok = AutoTokenizer.from_pretrained(processor_dir)
    ids = tok(PROMPTS, padding="max_length", max_length=CTX, truncation=True, return_tensors="pt")["input_ids"]
    pixels = AutoImageProcessor.from_pretrained(processor_dir)(images=images(5), return_tensors="pt")["pixel_values"]
    expected = reference_scores(state, pixels, ids, tok.eos_token_id)
    assert out.valid.all() and torch.allclose(out.scores, expected, atol=1e-4), (out.scores, expected)
    single = get_reward("hpsv2", model_path=checkpoint, processor_name_or_path=processor_dir, text_heads=TEXT_HEADS,
                        vision_heads=VIS_HEADS, batch_size=1)(images(5), PROMPTS).scores
    assert torch.allclose(single, out.scores, atol=1e-5)


def test_converted_directory_loads_the_same(setup, tmp_path, monkeypatch):
    checkpoint, processor_dir, _ = setup
    convert_main(["--checkpoint", checkpoint, "--out", str(tmp_path / "hf"), "--text-heads", str(TEXT_HEADS),
                  "--vision-heads", str(VIS_HEADS), "--processor", processor_dir])
    monkeypatch.setenv("HPSV2_MODEL_PATH", str(tmp_path / "hf"))
    monkeypatch.setenv("HPSV2_PROCESSOR_NAME_OR_PATH", processor_dir)
    from_dir = get_reward("hpsv2")(images(3), PROMPTS[:3]).scores
    from_pt = get_reward("hpsv2", model_path=checkpoint, text_heads=TEXT_HEADS, vision_heads=VIS_HEADS)(
        images(3), PROMPTS[:3]).scores
    assert torch.allclose(from_dir, from_pt, atol=1e-6)


def test_errors_name_the_env_var(setup, tmp_path, monkeypatch):
    checkpoint, processor_dir, state = setup
    monkeypatch.delenv("HPSV2_MODEL_PATH", raising=False)
    with pytest.raises(ValueError, match="HPSV2_MODEL_PATH"):
        get_reward("hpsv2", processor_name_or_path=processor_dir)
    with pytest.raises(OSError, match="missing.pt.*HPSV2_MODEL_PATH"):
        get_reward("hpsv2", model_path=str(tmp_path / "missing.pt"), processor_name_or_path=processor_dir)
    with pytest.raises(KeyError, match="visual.extra_head"):
        convert_state_dict({**state, "visual.extra_head.weight": torch.zeros(1)})
