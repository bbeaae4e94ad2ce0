"""Tiny random models in the real on-disk formats, for tests and bench/reward_throughput.py (CPU, seconds).

Each builder uses the same transformers classes as the reward, saves with ``save_pretrained`` (or the published head
format) and returns the path the reward loads through its real loading code.
"""
from __future__ import annotations

import os

import torch

WORDS = [f"w{i}" for i in range(200)] + "a photo of red green blue cat dog car bench left right the sign".split()


def _tiny_tokenizer(model_max_length: int = 77, extra_words=()):
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<unk>", "<|startoftext|>", "<|endoftext|>"]  # BOS != 0: OWLv2 masks queries starting with 0
    vocab = {tok: i for i, tok in enumerate(dict.fromkeys(specials + WORDS + list(extra_words)))}
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


def build_tiny_clip(out_dir, seed: int = 0, projection_dim: int = 16, logit_scale: float | None = None,
                    extra_words=()) -> str:
    """Tiny ``CLIPModel`` + tokenizer + ``CLIPImageProcessor`` (32x32 images) saved to ``out_dir``; ``extra_words``
    extend the word-level vocabulary (after the default words, so the default model is unchanged without them)."""
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel

    tokenizer, vocab = _tiny_tokenizer(extra_words=extra_words)
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


def random_open_clip_state(vocab: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """A random open_clip CLIP state dict (OpenAI-style keys) with text width 32, vision width 48, 2 layers each,
    patch 8 on 32 px images, context 77, embedding 16 (heads are not in the shapes: use 2 text, 3 vision)."""
    TEXT_W, VIS_W, EMBED, PATCH, GRID, LAYERS, CTX = 32, 48, 16, 8, 4, 2, 77
    g = torch.Generator().manual_seed(seed)

    def r(*shape, scale=0.2):
        return torch.randn(*shape, generator=g) * scale

    state = {"token_embedding.weight": r(vocab, TEXT_W), "positional_embedding": r(CTX, TEXT_W),
             "ln_final.weight": 1 + r(TEXT_W), "ln_final.bias": r(TEXT_W), "text_projection": r(TEXT_W, EMBED),
             "logit_scale": torch.tensor(4.6), "visual.class_embedding": r(VIS_W),
             "visual.positional_embedding": r(GRID * GRID + 1, VIS_W), "visual.conv1.weight": r(VIS_W, 3, PATCH, PATCH),
             "visual.ln_pre.weight": 1 + r(VIS_W), "visual.ln_pre.bias": r(VIS_W),
             "visual.ln_post.weight": 1 + r(VIS_W),
             "visual.ln_post.bias": r(VIS_W), "visual.proj": r(VIS_W, EMBED), "attn_mask": torch.zeros(CTX, CTX)}
    for prefix, width in (("transformer", TEXT_W), ("visual.transformer", VIS_W)):
        for b in range(LAYERS):
            p = f"{prefix}.resblocks.{b}."
            state.update({p + "ln_1.weight": 1 + r(width), p + "ln_1.bias": r(width),
                          p + "attn.in_proj_weight": r(3 * width, width), p + "attn.in_proj_bias": r(3 * width),
                          p + "attn.out_proj.weight": r(width, width), p + "attn.out_proj.bias": r(width),
                          p + "ln_2.weight": 1 + r(width), p + "ln_2.bias": r(width),
                          p + "mlp.c_fc.weight": r(4 * width, width), p + "mlp.c_fc.bias": r(4 * width),
                          p + "mlp.c_proj.weight": r(width, 4 * width), p + "mlp.c_proj.bias": r(width)})
    return state


def random_imagereward_state(vocab: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """A random state dict in the published ImageReward.pt layout (original BLIP names): ViT width 32, 2 blocks,
    patch 8 on 32 px; BERT width 24, 2 layers, 40 positions, cross-attention to width 32 (heads: 2 vision, 3 text)."""
    V_W, V_LAYERS, PATCH, IMG, T_W, T_LAYERS, MAXPOS = 32, 2, 8, 32, 24, 2, 40
    g = torch.Generator().manual_seed(seed)

    def r(*shape, scale=0.2):
        return torch.randn(*shape, generator=g) * scale

    grid = IMG // PATCH
    s = {"blip.visual_encoder.cls_token": r(1, 1, V_W), "blip.visual_encoder.pos_embed": r(1, grid * grid + 1, V_W),
         "blip.visual_encoder.patch_embed.proj.weight": r(V_W, 3, PATCH, PATCH),
         "blip.visual_encoder.patch_embed.proj.bias": r(V_W),
         "blip.visual_encoder.norm.weight": 1 + r(V_W), "blip.visual_encoder.norm.bias": r(V_W),
         "blip.vision_proj.weight": r(8, V_W), "blip.text_proj.weight": r(8, T_W)}  # unused ITC heads
    for b in range(V_LAYERS):
        p = f"blip.visual_encoder.blocks.{b}."
        s.update({p + "norm1.weight": 1 + r(V_W), p + "norm1.bias": r(V_W), p + "attn.qkv.weight": r(3 * V_W, V_W),
                  p + "attn.qkv.bias": r(3 * V_W), p + "attn.proj.weight": r(V_W, V_W), p + "attn.proj.bias": r(V_W),
                  p + "norm2.weight": 1 + r(V_W), p + "norm2.bias": r(V_W), p + "mlp.fc1.weight": r(4 * V_W, V_W),
                  p + "mlp.fc1.bias": r(4 * V_W), p + "mlp.fc2.weight": r(V_W, 4 * V_W), p + "mlp.fc2.bias": r(V_W)})
    t = "blip.text_encoder."
    s.update({t + "embeddings.word_embeddings.weight": r(vocab, T_W),
              t + "embeddings.position_embeddings.weight": r(MAXPOS, T_W),
              t + "embeddings.LayerNorm.weight": 1 + r(T_W), t + "embeddings.LayerNorm.bias": r(T_W),
              t + "embeddings.position_ids": torch.arange(MAXPOS)[None]})
    for b in range(T_LAYERS):
        p = f"{t}encoder.layer.{b}."
        for att, kv_width in (("attention", T_W), ("crossattention", V_W)):
            s.update({p + f"{att}.self.query.weight": r(T_W, T_W), p + f"{att}.self.query.bias": r(T_W),
                      p + f"{att}.self.key.weight": r(T_W, kv_width), p + f"{att}.self.key.bias": r(T_W),
                      p + f"{att}.self.value.weight": r(T_W, kv_width), p + f"{att}.self.value.bias": r(T_W),
                      p + f"{att}.output.dense.weight": r(T_W, T_W), p + f"{att}.output.dense.bias": r(T_W),
                      p + f"{att}.output.LayerNorm.weight": 1 + r(T_W), p + f"{att}.output.LayerNorm.bias": r(T_W)})
        s.update({p + "intermediate.dense.weight": r(4 * T_W, T_W), p + "intermediate.dense.bias": r(4 * T_W),
                  p + "output.dense.weight": r(T_W, 4 * T_W), p + "output.dense.bias": r(T_W),
                  p + "output.LayerNorm.weight": 1 + r(T_W), p + "output.LayerNorm.bias": r(T_W)})
    for k, (i, o) in zip((0, 2, 4, 6, 7), ((T_W, 1024), (1024, 128), (128, 64), (64, 16), (16, 1))):
        s[f"mlp.layers.{k}.weight"], s[f"mlp.layers.{k}.bias"] = r(o, i, scale=0.1), r(o, scale=0.1)
    return s


def build_tiny_hpsv2(root) -> dict:
    """HPS v2.1 kwargs: a random open_clip checkpoint in the published format + a tiny CLIP processor."""
    processor = build_tiny_clip(os.path.join(str(root), "hps_processor"))
    from transformers import AutoTokenizer

    path = os.path.join(str(root), "HPS_v2.1_tiny.pt")
    torch.save({"state_dict": random_open_clip_state(len(AutoTokenizer.from_pretrained(processor)))}, path)
    return {"model_path": path, "processor_name_or_path": processor, "text_heads": 2, "vision_heads": 3}


def build_tiny_imagereward(root) -> dict:
    """ImageReward kwargs: a random ImageReward.pt + a tiny BERT-style tokenizer."""
    tokenizer = build_tiny_bert_tokenizer(os.path.join(str(root), "ir_tokenizer"))
    from transformers import AutoTokenizer

    path = os.path.join(str(root), "ImageReward_tiny.pt")
    torch.save(random_imagereward_state(len(AutoTokenizer.from_pretrained(tokenizer))), path)
    return {"model_path": path, "tokenizer_path": tokenizer, "vision_heads": 2, "text_heads": 3}
