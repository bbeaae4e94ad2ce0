"""imagereward: a tiny random checkpoint in the published ImageReward.pt layout (original BLIP key names) loaded
through the real path onto transformers' BLIP classes, checked against an independent plain-torch forward of the
original architecture (timm-style pre-LN ViT, post-LN BERT with cross-attention, MLP head, published normalisation)."""
import math

import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from deepgen_rl.rewards import get_reward
from deepgen_rl.rewards.imagereward import REWARD_MEAN, REWARD_STD, split_checkpoint
from deepgen_rl.rewards.testing import build_tiny_bert_tokenizer, random_imagereward_state

V_W, V_HEADS, V_LAYERS, PATCH, IMG = 32, 2, 2, 8, 32  # the shapes random_imagereward_state builds
T_W, T_HEADS, T_LAYERS = 24, 3, 2


def attention(q, k, v, heads, mask=None):
    b, n, w = q.shape
    split = lambda x: x.view(b, x.shape[1], heads, w // heads).transpose(1, 2)  # noqa: E731
    scores = split(q) @ split(k).transpose(-1, -2) / math.sqrt(w // heads)
    if mask is not None:
        scores = scores + mask
    return (scores.softmax(-1) @ split(v)).transpose(1, 2).reshape(b, n, w)


@torch.no_grad()
def reference(s, pixels, ids, attn_mask):
    v = "blip.visual_encoder."
    x = F.conv2d(pixels, s[v + "patch_embed.proj.weight"], s[v + "patch_embed.proj.bias"], stride=PATCH)
    x = torch.cat([s[v + "cls_token"].expand(x.shape[0], 1, -1), x.flatten(2).transpose(1, 2)], 1) + s[v + "pos_embed"]
    for b in range(V_LAYERS):
        p = f"{v}blocks.{b}."
        h = F.layer_norm(x, (V_W,), s[p + "norm1.weight"], s[p + "norm1.bias"], eps=1e-6)
        q, k, val = F.linear(h, s[p + "attn.qkv.weight"], s[p + "attn.qkv.bias"]).chunk(3, dim=-1)
        x = x + F.linear(attention(q, k, val, V_HEADS), s[p + "attn.proj.weight"], s[p + "attn.proj.bias"])
        h = F.layer_norm(x, (V_W,), s[p + "norm2.weight"], s[p + "norm2.bias"], eps=1e-6)
        x = x + F.linear(F.gelu(F.linear(h, s[p + "mlp.fc1.weight"], s[p + "mlp.fc1.bias"])), s[p + "mlp.fc2.weight"],
                         s[p + "mlp.fc2.bias"])
    image = F.layer_norm(x, (V_W,), s[v + "norm.weight"], s[v + "norm.bias"], eps=1e-6)
    t = "blip.text_encoder."
    y = s[t + "embeddings.word_embeddings.weight"][ids] + s[t + "embeddings.position_embeddings.weight"][:ids.shape[1]]
    y = F.layer_norm(y, (T_W,), s[t + "embeddings.LayerNorm.weight"], s[t + "embeddings.LayerNorm.bias"], eps=1e-12)
    mask = (1.0 - attn_mask[:, None, None, :].float()) * torch.finfo(torch.float32).min
    for b in range(T_LAYERS):
        p = f"{t}encoder.layer.{b}."
        for att, kv, m in (("attention", None, mask), ("crossattention", image, None)):
            src = y if kv is None else kv
            w = {n: (s[p + f"{att}.self.{n}.weight"], s[p + f"{att}.self.{n}.bias"]) for n in ("query", "key", "value")}
            a = attention(F.linear(y, *w["query"]), F.linear(src, *w["key"]), F.linear(src, *w["value"]), T_HEADS, m)
            a = F.linear(a, s[p + f"{att}.output.dense.weight"], s[p + f"{att}.output.dense.bias"])
            y = F.layer_norm(a + y, (T_W,), s[p + f"{att}.output.LayerNorm.weight"],
                             s[p + f"{att}.output.LayerNorm.bias"], eps=1e-12)
        f = F.gelu(F.linear(y, s[p + "intermediate.dense.weight"], s[p + "intermediate.dense.bias"]))
        f = F.linear(f, s[p + "output.dense.weight"], s[p + "output.dense.bias"])
        y = F.layer_norm(f + y, (T_W,), s[p + "output.LayerNorm.weight"], s[p + "output.LayerNorm.bias"], eps=1e-12)
    h = y[:, 0]
    for k in (0, 2, 4, 6, 7):
        h = F.linear(h, s[f"mlp.layers.{k}.weight"], s[f"mlp.layers.{k}.bias"])
    return ((h - REWARD_MEAN) / REWARD_STD).squeeze(-1)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("imagereward")
    tokenizer_dir = build_tiny_bert_tokenizer(root / "bert")
    from transformers import AutoTokenizer

    state = random_imagereward_state(len(AutoTokenizer.from_pretrained(tokenizer_dir)))
    torch.save(state, root / "ImageReward.pt")
    return str(root / "ImageReward.pt"), tokenizer_dir, state


PROMPTS = ["a photo of a cat", "a red car left of a bench", "green", "the blue dog"]


def images(n):
    return [Image.new("RGB", (40 + 6 * i, 36), ((70 * i) % 256, 90 + 30 * i, 200 - 40 * i)) for i in range(n)]


def test_imagereward_matches_independent_blip_forward(setup):
    from transformers import AutoTokenizer, CLIPImageProcessor

    path, tokenizer_dir, state = setup
    kwargs = dict(model_path=path, tokenizer_path=tokenizer_dir, vision_heads=V_HEADS, text_heads=T_HEADS)
    out = get_reward("imagereward", batch_size=3, **kwargs)(images(4), PROMPTS)
    text = AutoTokenizer.from_pretrained(tokenizer_dir)(PROMPTS, padding="max_length", truncation=True, max_length=35,
                                                         return_tensors="pt")
    pixels = CLIPImageProcessor(size={"shortest_edge": IMG}, crop_size={"height": IMG, "width": IMG})(
        images=images(4), return_tensors="pt")["pixel_values"]
    expected = reference(state, pixels, text["input_ids"], text["attention_mask"])
    assert out.valid.all() and torch.allclose(out.scores, expected, atol=1e-4), (out.scores, expected)
    single = get_reward("imagereward", batch_size=1, **kwargs)(images(4), PROMPTS).scores
    assert torch.allclose(single, out.scores, atol=1e-5)


def test_errors_name_env_vars_and_keys(setup, tmp_path, monkeypatch):
    path, tokenizer_dir, state = setup
    monkeypatch.delenv("IMAGEREWARD_MODEL_PATH", raising=False)
    with pytest.raises(ValueError, match="IMAGEREWARD_MODEL_PATH"):
        get_reward("imagereward", tokenizer_path=tokenizer_dir)
    with pytest.raises(FileNotFoundError, match="IMAGEREWARD_MODEL_PATH"):
        get_reward("imagereward", model_path=str(tmp_path / "nope.pt"), tokenizer_path=tokenizer_dir)
    with pytest.raises(KeyError, match="blip.extra"):
        split_checkpoint({**state, "blip.extra.weight": torch.zeros(1)})
    broken = {k: v for k, v in state.items() if not k.startswith("mlp.layers.7")}
    torch.save(broken, tmp_path / "broken.pt")
    with pytest.raises(ValueError, match="IMAGEREWARD_MODEL_PATH"):
        get_reward("imagereward", model_path=str(tmp_path / "broken.pt"), tokenizer_path=tokenizer_dir,
                   vision_heads=V_HEADS, text_heads=T_HEADS)
