"""Tiny random models in the real on-disk formats, for tests and bench/reward_throughput.py (CPU, seconds).

Each builder uses the same transformers classes as the reward, saves with ``save_pretrained`` (or the published head
format) and returns the path the reward loads through its real loading code.
"""
from __future__ import annotations

import os

import torch

WORDS = [f"w{i}" for i in range(200)] + "a photo of red green blue cat dog car bench left right the sign".split()


def _tiny_tokenizer(model_max_length: int = 77):
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<unk>", "<|startoftext|>", "<|endoftext|>"]  # BOS != 0: OWLv2 masks queries starting with 0
    vocab = {tok: i for i, tok in enumerate(specials + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(
        single="<|startoftext|> $A <|endoftext|>",
        special_tokens=[("<|startoftext|>", vocab["<|startoftext|>"]), ("<|endoftext|>", vocab["<|endoftext|>"])],
    )
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|startoftext|>", eos_token="<|endoftext|>",
                                        pad_token="<pad>", unk_token="<unk>", model_max_length=model_max_length)
    return tokenizer, vocab


def _text_config(vocab, max_positions: int = 77) -> dict:
    return dict(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=2, max_position_embeddings=max_positions, bos_token_id=vocab["<|startoftext|>"],
                eos_token_id=vocab["<|endoftext|>"], pad_token_id=vocab["<pad>"])


def build_tiny_clip(out_dir, seed: int = 0, projection_dim: int = 16, logit_scale: float | None = None) -> str:
    """Tiny ``CLIPModel`` + tokenizer + ``CLIPImageProcessor`` (32x32 images) saved to ``out_dir``."""
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel

    tokenizer, vocab = _tiny_tokenizer()
    config = CLIPConfig(text_config=_text_config(vocab),
                        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                           num_attention_heads=2, image_size=32, patch_size=8),
                        projection_dim=projection_dim)
    torch.manual_seed(seed)
    model = CLIPModel(config)
    if logit_scale is not None:
        with torch.no_grad():
            model.logit_scale.fill_(logit_scale)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}).save_pretrained(out_dir)
    return str(out_dir)


def build_aesthetic_head(path, input_size: int = 16, kind: str = "mlp", seed: int = 0) -> str:
    """A random LAION aesthetic head state dict (``kind`` "mlp" or "linear") saved as .pth or .safetensors."""
    from .aesthetic import AestheticMLP

    torch.manual_seed(seed)
    head = AestheticMLP(input_size) if kind == "mlp" else torch.nn.Linear(input_size, 1)
    state = {k: v.contiguous() for k, v in head.state_dict().items()}
    path = str(path)
    if path.endswith(".safetensors"):
        from safetensors.torch import save_file

        save_file(state, path)
    else:
        torch.save(state, path)
    return path


def build_tiny_owlv2(out_dir, seed: int = 0) -> str:
    """Tiny ``Owlv2ForObjectDetection`` + ``Owlv2Processor`` (32x32 images, 16-token queries) saved to ``out_dir``."""
    from transformers import Owlv2Config, Owlv2ForObjectDetection, Owlv2ImageProcessor, Owlv2Processor

    tokenizer, vocab = _tiny_tokenizer(model_max_length=16)
    config = Owlv2Config(text_config=_text_config(vocab, max_positions=16),
                         vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                            num_attention_heads=2, image_size=32, patch_size=8),
                         projection_dim=32)  # the class head compares query embeddings at the text width
    torch.manual_seed(seed)
    Owlv2ForObjectDetection(config).save_pretrained(out_dir)
    processor = Owlv2Processor(image_processor=Owlv2ImageProcessor(size={"height": 32, "width": 32}),
                               tokenizer=tokenizer)
    processor.save_pretrained(out_dir)
    return str(out_dir)


def tiny_dir(name: str) -> str:
    """A per-user cache folder for tiny models (``$DEEPGEN_TINY_DIR`` or ~/.cache/deepgen_rl/tiny)."""
    root = os.environ.get("DEEPGEN_TINY_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "deepgen_rl", "tiny")
    path = os.path.join(root, name)
    os.makedirs(path, exist_ok=True)
    return path


def build_tiny_bert_tokenizer(out_dir) -> str:
    """A word-level tokenizer with BERT's special tokens ([PAD]=0, [CLS] first, [SEP] last) saved to ``out_dir``."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab = {tok: i for i, tok in enumerate(specials + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, cls_token="[CLS]", sep_token="[SEP]", pad_token="[PAD]",
                                        unk_token="[UNK]", mask_token="[MASK]", model_max_length=512)
    tokenizer.save_pretrained(out_dir)
    return str(out_dir)
