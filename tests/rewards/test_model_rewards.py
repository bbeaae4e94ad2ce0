"""pickscore and aesthetic on tiny random CLIPs saved with save_pretrained (and heads in the published formats),
loaded back through the rewards' real loading code; numbers checked against independent computations."""
import math

import pytest
import torch
from PIL import Image

from deepgen_rl.rewards import get_reward
from deepgen_rl.rewards.testing import build_aesthetic_head, build_tiny_clip

PROMPTS = ["a photo of a cat", "a red car", "a dog left of a bench", "green sign", "the blue cat", "a photo"]


def images(n):
    return [Image.new("RGB", (40 + 3 * i, 48), ((50 * i) % 256, 200 - 20 * i, 90)) for i in range(n)]


@pytest.fixture(scope="module")
def clip_dir(tmp_path_factory):
    return build_tiny_clip(tmp_path_factory.mktemp("tiny_clip"), logit_scale=math.log(7.0))


def test_pickscore_is_logit_scale_times_cosine_as_clip_forward_computes_it(clip_dir):
    """Our score = exp(logit_scale)·cos; CLIPModel.forward's logits_per_image diagonal is the same quantity."""
    from transformers import AutoImageProcessor, AutoTokenizer, CLIPModel

    out = get_reward("pickscore", model_name_or_path=clip_dir, batch_size=4)(images(6), PROMPTS)
    assert out.valid.all() and out.scores.shape == (6,)
    model = CLIPModel.from_pretrained(clip_dir).eval()
    tok, proc = AutoTokenizer.from_pretrained(clip_dir), AutoImageProcessor.from_pretrained(clip_dir)
    text = tok(PROMPTS, padding="max_length", max_length=77, truncation=True, return_tensors="pt")
    with torch.no_grad():
        logits = model(input_ids=text["input_ids"], attention_mask=text["attention_mask"],
                       pixel_values=proc(images=images(6), return_tensors="pt")["pixel_values"]).logits_per_image
    assert torch.allclose(out.scores, logits.diagonal(), atol=1e-4)
    assert (out.scores.abs() <= 7.0 + 1e-5).all()  # |score| <= exp(logit_scale)
    divided = get_reward("pickscore", model_name_or_path=clip_dir, scale_divisor=7.0)(images(6), PROMPTS).scores
    assert torch.allclose(divided, out.scores / 7.0, atol=1e-6)


@pytest.mark.parametrize("name, kwargs", [("pickscore", {}), ("aesthetic", {"head": "mlp"})])
def test_batch_size_invariance(clip_dir, tmp_path, name, kwargs):
    extra = {}
    if kwargs.get("head"):
        extra["head_path"] = build_aesthetic_head(tmp_path / "head.pth", input_size=16)
    one = get_reward(name, model_name_or_path=clip_dir, batch_size=1, **extra)(images(6), PROMPTS).scores
    six = get_reward(name, model_name_or_path=clip_dir, batch_size=6, **extra)(images(6), PROMPTS).scores
    four = get_reward(name, model_name_or_path=clip_dir, batch_size=4, **extra)(images(6)[2:], PROMPTS[2:]).scores
    assert torch.allclose(one, six, atol=1e-5) and torch.allclose(four, six[2:], atol=1e-5)


def _manual_embeddings(clip_dir, imgs):
    from transformers import AutoImageProcessor, CLIPModel

    model = CLIPModel.from_pretrained(clip_dir).eval()
    pixels = AutoImageProcessor.from_pretrained(clip_dir)(images=imgs, return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        vision = model.vision_model(pixel_values=pixels).pooler_output
        emb = model.visual_projection(vision)
    return emb / emb.norm(dim=-1, keepdim=True)


def test_aesthetic_mlp_head_matches_the_published_layer_chain(clip_dir, tmp_path):
    head_path = build_aesthetic_head(tmp_path / "sac_logos_ava.pth", input_size=16, kind="mlp", seed=3)
    out = get_reward("aesthetic", model_name_or_path=clip_dir, head_path=head_path)(images(5), [""] * 5)
    state = torch.load(head_path, weights_only=True)
    x = _manual_embeddings(clip_dir, images(5))
    for k in (0, 2, 4, 6, 7):  # Linear layers without activations, dropout inactive at inference
        x = x @ state[f"layers.{k}.weight"].T + state[f"layers.{k}.bias"]
    assert out.valid.all() and torch.allclose(out.scores, x.squeeze(-1), atol=1e-5)


def test_aesthetic_linear_head_from_safetensors(clip_dir, tmp_path, monkeypatch):
    head_path = build_aesthetic_head(tmp_path / "linear.safetensors", input_size=16, kind="linear", seed=1)
    monkeypatch.setenv("AESTHETIC_HEAD_PATH", head_path)
    monkeypatch.setenv("AESTHETIC_CLIP_MODEL_NAME_OR_PATH", clip_dir)
    out = get_reward("aesthetic")(images(3), [""] * 3)
    from safetensors.torch import load_file

    state = load_file(head_path)
    expected = _manual_embeddings(clip_dir, images(3)) @ state["weight"].T + state["bias"]
    assert torch.allclose(out.scores, expected.squeeze(-1), atol=1e-5)


def test_errors_name_the_env_var_and_path(clip_dir, tmp_path, monkeypatch):
    for var in ("PICKSCORE_MODEL_NAME_OR_PATH", "AESTHETIC_CLIP_MODEL_NAME_OR_PATH", "CLIP_MODEL_NAME_OR_PATH",
                "AESTHETIC_HEAD_PATH", "GENEVAL_DETECTOR_PATH"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ValueError, match="PICKSCORE_MODEL_NAME_OR_PATH"):
        get_reward("pickscore")
    with pytest.raises(OSError, match=r"nowhere.*PICKSCORE_MODEL_NAME_OR_PATH"):
        get_reward("pickscore", model_name_or_path=str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError, match="AESTHETIC_HEAD_PATH"):
        get_reward("aesthetic", model_name_or_path=clip_dir)
    torch.save({"fc.weight": torch.zeros(1, 16)}, tmp_path / "odd.pth")
    with pytest.raises(ValueError, match="AESTHETIC_HEAD_PATH"):
        get_reward("aesthetic", model_name_or_path=clip_dir, head_path=str(tmp_path / "odd.pth"))
    wrong_dim = build_aesthetic_head(tmp_path / "768.pth", input_size=768)
    with pytest.raises(ValueError, match="768-dim"):
        get_reward("aesthetic", model_name_or_path=clip_dir, head_path=wrong_dim)
    with pytest.raises(ValueError, match="GENEVAL_DETECTOR_PATH"):
        get_reward("geneval")
