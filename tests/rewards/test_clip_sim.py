"""clip_sim with a tiny random CLIP (built offline, saved with save_pretrained, loaded back)."""
import pytest
import torch
from PIL import Image

from deepgen_rl.rewards import get_reward

WORDS = [f"w{i}" for i in range(200)] + ["a", "photo", "of", "red", "cat", "dog"]


def build_tiny_clip(out_dir) -> str:
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, PreTrainedTokenizerFast

    specials = ["<|startoftext|>", "<|endoftext|>", "<pad>", "<unk>"]
    vocab = {tok: i for i, tok in enumerate(specials + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(
        single="<|startoftext|> $A <|endoftext|>",
        special_tokens=[("<|startoftext|>", vocab["<|startoftext|>"]), ("<|endoftext|>", vocab["<|endoftext|>"])],
    )
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|startoftext|>", eos_token="<|endoftext|>",
                                        pad_token="<pad>", unk_token="<unk>", model_max_length=77)
    config = CLIPConfig(
        text_config=dict(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, max_position_embeddings=77, bos_token_id=vocab["<|startoftext|>"],
                         eos_token_id=vocab["<|endoftext|>"], pad_token_id=vocab["<pad>"]),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                           image_size=32, patch_size=8),
        projection_dim=16,
    )
    torch.manual_seed(0)
    CLIPModel(config).save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}).save_pretrained(out_dir)
    return str(out_dir)


@pytest.fixture(scope="module")
def clip_dir(tmp_path_factory):
    return build_tiny_clip(tmp_path_factory.mktemp("tiny_clip"))


def images(n):
    return [Image.new("RGB", (40 + i, 48), (30 * i % 256, 200, 90)) for i in range(n)]


def test_scores_shape_range_and_determinism(clip_dir):
    reward = get_reward("clip_sim", model_name_or_path=clip_dir, batch_size=3)
    prompts = ["a photo of a red cat", "a photo of a dog", "w1 w2 w3", "cat", "dog dog", "a"]
    out = reward(images(6), prompts, [{}] * 6)
    assert out.scores.shape == (6,) and out.scores.dtype == torch.float32 and out.valid.all()
    assert ((out.scores >= -1) & (out.scores <= 1)).all()
    assert out.info["num_truncated"] == 0 and out.info["num_scored"] == 6
    # batching does not change the result
    assert torch.allclose(get_reward("clip_sim", model_name_or_path=clip_dir, batch_size=6)(images(6), prompts,
                                                                                           [{}] * 6).scores,
                          out.scores, atol=1e-5)


def test_long_prompt_is_truncated_keeping_end_of_text_and_counted(clip_dir):
    reward = get_reward("clip_sim", model_name_or_path=clip_dir)
    long_prompt = " ".join(WORDS[:150])  # 150 tokens + bos/eos > 77
    cut_prompt = " ".join(WORDS[:75])  # what survives: bos + 75 words + eos = 77
    image = images(1)[0]
    out = reward([image, image, image], [long_prompt, cut_prompt, "a cat"], [{}] * 3)
    assert out.info["num_truncated"] == 1
    assert out.scores[0].item() == pytest.approx(out.scores[1].item(), abs=1e-6)
    batch, truncated = reward._tokenize([long_prompt])
    assert truncated == 1 and batch["input_ids"].shape[1] == 77
    assert batch["input_ids"][0, -1].item() == reward.eos_token_id
    cut, _ = reward._tokenize([cut_prompt])
    assert torch.equal(batch["input_ids"], cut["input_ids"])


def test_clear_error_without_model(monkeypatch, tmp_path):
    monkeypatch.delenv("CLIP_MODEL_NAME_OR_PATH", raising=False)
    with pytest.raises(ValueError, match="CLIP_MODEL_NAME_OR_PATH"):
        get_reward("clip_sim")
    monkeypatch.setenv("CLIP_MODEL_NAME_OR_PATH", str(tmp_path / "missing"))
    with pytest.raises(OSError, match="CLIP_MODEL_NAME_OR_PATH"):
        get_reward("clip_sim")


def test_scores_equal_an_independent_cosine_and_depend_on_the_prompt(clip_dir):
    """Recompute cos(text, image) with the model's own feature functions on our own tokenisation (longest padding)
    and preprocessing (32x32 images need no resize/crop: rescale + CLIP mean/std by hand)."""
    from transformers import AutoTokenizer, CLIPModel

    reward = get_reward("clip_sim", model_name_or_path=clip_dir, batch_size=2)
    gen = torch.Generator().manual_seed(0)
    pixels = [torch.randint(0, 256, (32, 32, 3), generator=gen, dtype=torch.uint8) for _ in range(2)]
    pil = [Image.fromarray(p.numpy(), "RGB") for p in pixels]
    prompts = ["a photo of a red cat", "dog w5 w17", "a photo of a red cat", "w9"]
    batch_images = [pil[0], pil[0], pil[1], pil[1]]
    out = reward(batch_images, prompts, [{}] * 4)

    model = CLIPModel.from_pretrained(clip_dir).eval()
    tokens = AutoTokenizer.from_pretrained(clip_dir)(prompts, padding=True, return_tensors="pt")
    mean = torch.tensor([0.48145466, 0.4578275, 0.40821073]).view(3, 1, 1)
    std = torch.tensor([0.26862954, 0.26130258, 0.27577711]).view(3, 1, 1)
    pixel_values = torch.stack([(pixels[i].permute(2, 0, 1).float() / 255 - mean) / std for i in (0, 0, 1, 1)])

    def tensor(output):
        return output if isinstance(output, torch.Tensor) else output.pooler_output

    with torch.no_grad():
        text = tensor(model.get_text_features(input_ids=tokens["input_ids"], attention_mask=tokens["attention_mask"]))
        image = tensor(model.get_image_features(pixel_values=pixel_values))
    expected = (text / text.norm(dim=-1, keepdim=True) * (image / image.norm(dim=-1, keepdim=True))).sum(-1)
    assert torch.allclose(out.scores, expected, atol=1e-5), (out.scores, expected)
    # the same image, different prompts -> different scores (and the same prompt, different images too)
    assert abs(out.scores[0] - out.scores[1]) > 1e-3 and abs(out.scores[2] - out.scores[3]) > 1e-3
    assert abs(out.scores[0] - out.scores[2]) > 1e-3


def _fake_gpus(monkeypatch, count=8, current=0):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current)


def test_bare_cuda_resolves_to_the_ranks_gpu(monkeypatch):
    from deepgen_rl.rewards.clip_sim import resolve_device

    _fake_gpus(monkeypatch)
    monkeypatch.setenv("LOCAL_RANK", "5")
    monkeypatch.delenv("CLIP_DEVICE", raising=False)
    assert resolve_device("cuda") == torch.device("cuda", 5)
    assert resolve_device("cuda:2") == torch.device("cuda", 2)  # an explicit index is kept
    monkeypatch.setenv("CLIP_DEVICE", "cuda")
    assert resolve_device(None) == torch.device("cuda", 5)
    monkeypatch.delenv("LOCAL_RANK")
    _fake_gpus(monkeypatch, current=3)
    assert resolve_device("cuda") == torch.device("cuda", 3)  # no torchrun: the current device
    monkeypatch.delenv("CLIP_DEVICE")
    assert resolve_device(None) == torch.device("cpu")
    with pytest.raises(ValueError, match="does not exist"):
        resolve_device("cuda:9")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="CLIP_DEVICE"):
        resolve_device("cuda")


def test_bare_cuda_is_the_only_visible_gpu_when_each_process_sees_one(monkeypatch):
    """torchrun with CUDA_VISIBLE_DEVICES set per rank: LOCAL_RANK is 5 but the process sees one GPU, cuda:0."""
    from deepgen_rl.rewards.clip_sim import resolve_device

    _fake_gpus(monkeypatch, count=1, current=0)
    monkeypatch.setenv("LOCAL_RANK", "5")
    monkeypatch.setenv("CLIP_DEVICE", "cuda")
    assert resolve_device(None) == torch.device("cuda", 0)
    assert resolve_device("cuda") == torch.device("cuda", 0)
    monkeypatch.delenv("LOCAL_RANK")
    assert resolve_device("cuda") == torch.device("cuda", 0)
    with pytest.raises(ValueError, match="does not exist; 1 GPU"):  # an explicit index is still checked
        resolve_device("cuda:5")
    _fake_gpus(monkeypatch, count=2)  # two visible GPUs: LOCAL_RANK is an index again, and 5 is not one of them
    monkeypatch.setenv("LOCAL_RANK", "5")
    with pytest.raises(ValueError, match="LOCAL_RANK"):
        resolve_device("cuda")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert resolve_device("cuda") == torch.device("cuda", 1)


@pytest.mark.parametrize("visible,gpu", [(8, 3), (1, 0)])
def test_cuda_device_pinned_at_construction_and_inputs_follow_the_weights(clip_dir, monkeypatch, visible, gpu):
    """Rank 3 of 8 asks for CLIP_DEVICE=cuda: the model goes to cuda:3 (not "cuda", which a reward worker thread
    would read as cuda:0), or to cuda:0 when the process sees only its own GPU; score() sends its inputs to wherever
    the weights are (here the mocked move leaves them on the CPU), giving the CPU scores."""
    from transformers import CLIPModel

    cpu_reward = get_reward("clip_sim", model_name_or_path=clip_dir, device="cpu")
    imgs, prompts = images(3), ["a photo of a red cat", "a dog", "w1 w2"]
    expected, _, _ = cpu_reward.score(imgs, prompts, [{}] * 3)
    moves = []

    def fake_to(self, *args, **kwargs):
        moves.append(args[0] if args else kwargs.get("device"))
        return self

    _fake_gpus(monkeypatch, count=visible)
    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.setenv("CLIP_DEVICE", "cuda")
    monkeypatch.setattr(CLIPModel, "to", fake_to)
    reward = get_reward("clip_sim", model_name_or_path=clip_dir)
    assert [torch.device(m) for m in moves] == [torch.device("cuda", gpu)]
    scores, valid, _ = reward.score(imgs, prompts, [{}] * 3)
    assert valid.all() and torch.equal(scores, expected)
