"""Convert an open_clip CLIP checkpoint (OpenAI-style ``visual.transformer.resblocks...`` keys, e.g. the HPS v2.1
checkpoint on ViT-H-14) into a transformers ``CLIPModel``, so that it loads and runs without open_clip.

    python -m deepgen_rl.rewards.open_clip_convert --checkpoint HPS_v2.1_compressed.pt --out /w/hpsv2.1-hf \
        [--processor laion/CLIP-ViT-H-14-laion2B-s32B-b79K]

Key map (open_clip → transformers), per transformer block b of the tower T (``transformer`` = text,
``visual.transformer`` = vision): ``resblocks.b.ln_1/ln_2`` → ``layers.b.layer_norm1/2``; ``attn.in_proj_weight``
[3W, W] split in order into q/k/v_proj [W, W] (bias likewise); ``attn.out_proj`` → ``self_attn.out_proj``;
``mlp.c_fc/c_proj`` → ``mlp.fc1/fc2``. Embeddings: ``token_embedding``, ``positional_embedding``,
``visual.conv1`` → patch embedding, ``visual.class_embedding``, ``visual.positional_embedding``; norms ``ln_final``,
``visual.ln_pre/ln_post`` → ``final_layer_norm``, ``pre_layrnorm``, ``post_layernorm``; projections
``text_projection`` [W_t, E] and ``visual.proj`` [W_v, E] are transposed into the Linear weights [E, W].
The widths, depths, MLP sizes, context, vocabulary, patch and image size come from the tensor shapes; the head
counts cannot and are arguments (ViT-H-14: 16 and 16). Activation: exact GELU (ViT-H-14 is not a quick-GELU model).
"""
from __future__ import annotations

import argparse
import math
import re

import torch

_BLOCK = re.compile(r"^(visual\.)?transformer\.resblocks\.(\d+)\.(.+)$")
_BLOCK_RENAMES = {"ln_1": "layer_norm1", "ln_2": "layer_norm2", "attn.out_proj": "self_attn.out_proj",
                  "mlp.c_fc": "mlp.fc1", "mlp.c_proj": "mlp.fc2"}
_DIRECT = {
    "token_embedding.weight": "text_model.embeddings.token_embedding.weight",
    "positional_embedding": "text_model.embeddings.position_embedding.weight",
    "ln_final.weight": "text_model.final_layer_norm.weight",
    "ln_final.bias": "text_model.final_layer_norm.bias",
    "logit_scale": "logit_scale",
    "visual.class_embedding": "vision_model.embeddings.class_embedding",
    "visual.positional_embedding": "vision_model.embeddings.position_embedding.weight",
    "visual.conv1.weight": "vision_model.embeddings.patch_embedding.weight",
    "visual.ln_pre.weight": "vision_model.pre_layrnorm.weight",
    "visual.ln_pre.bias": "vision_model.pre_layrnorm.bias",
    "visual.ln_post.weight": "vision_model.post_layernorm.weight",
    "visual.ln_post.bias": "vision_model.post_layernorm.bias",
}


def read_checkpoint(path: str) -> dict[str, torch.Tensor]:
    """The tensors of an open_clip checkpoint (``{"state_dict": ...}`` or a bare state dict; ``module.`` stripped)."""
    state = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(state, dict) and "state_dict" in state:
        state = state["state_dict"]
    return {k.removeprefix("module."): v for k, v in state.items()}


def convert_state_dict(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """open_clip keys → CLIPModel keys (see the module docstring); KeyError naming every key it cannot place."""
    out, unknown = {}, []
    for key, value in state.items():
        if key in _DIRECT:
            out[_DIRECT[key]] = value
        elif key == "text_projection":
            out["text_projection.weight"] = value.t().contiguous()
        elif key == "visual.proj":
            out["visual_projection.weight"] = value.t().contiguous()
        elif key == "attn_mask":
            continue  # open_clip's causal mask buffer: CLIP builds its own
        elif match := _BLOCK.match(key):
            tower = "vision_model" if match.group(1) else "text_model"
            prefix, rest = f"{tower}.encoder.layers.{match.group(2)}", match.group(3)
            if rest.startswith("attn.in_proj_"):
                kind = rest.rsplit("_", 1)[1]  # weight / bias
                for name, part in zip(("q_proj", "k_proj", "v_proj"), value.chunk(3, dim=0)):
                    out[f"{prefix}.self_attn.{name}.{kind}"] = part.contiguous()
                continue
            module, _, param = rest.rpartition(".")
            if module not in _BLOCK_RENAMES:
                unknown.append(key)
                continue
            out[f"{prefix}.{_BLOCK_RENAMES[module]}.{param}"] = value
        else:
            unknown.append(key)
    if unknown:
        raise KeyError(f"open_clip checkpoint keys with no CLIPModel counterpart: {unknown[:8]} "
                       f"({len(unknown)} in all); only OpenAI-style ViT CLIP checkpoints are supported")
    return out


def infer_config(state: dict[str, torch.Tensor], *, text_heads: int, vision_heads: int, eos_token_id: int = 49407,
                 bos_token_id: int = 49406, pad_token_id: int = 0):
    """A ``CLIPConfig`` matching the open_clip ``state`` shapes."""
    from transformers import CLIPConfig

    def depth(prefix):
        return 1 + max(int(m.group(2)) for k in state if (m := _BLOCK.match(k)) and bool(m.group(1)) == prefix)

    vocab, text_width = state["token_embedding.weight"].shape
    vision_width, _, patch, _ = state["visual.conv1.weight"].shape
    grid = math.isqrt(state["visual.positional_embedding"].shape[0] - 1)
    return CLIPConfig(
        text_config=dict(vocab_size=int(vocab), hidden_size=int(text_width), num_hidden_layers=depth(False),
                         intermediate_size=int(state["transformer.resblocks.0.mlp.c_fc.weight"].shape[0]),
                         num_attention_heads=text_heads, max_position_embeddings=int(
                             state["positional_embedding"].shape[0]), hidden_act="gelu", layer_norm_eps=1e-5,
                         eos_token_id=eos_token_id, bos_token_id=bos_token_id, pad_token_id=pad_token_id),
        vision_config=dict(hidden_size=int(vision_width), num_hidden_layers=depth(True), patch_size=int(patch),
                           image_size=int(patch) * grid, num_attention_heads=vision_heads, hidden_act="gelu",
                           intermediate_size=int(state["visual.transformer.resblocks.0.mlp.c_fc.weight"].shape[0]),
                           layer_norm_eps=1e-5),
        projection_dim=int(state["text_projection"].shape[1]),
    )


def load_open_clip_as_hf(path: str, *, text_heads: int = 16, vision_heads: int = 16, eos_token_id: int = 49407,
                         bos_token_id: int = 49406, pad_token_id: int = 0):
    """``CLIPModel`` (eval, no grads) holding the open_clip checkpoint at ``path``; every tensor must be placed."""
    from transformers import CLIPModel

    state = read_checkpoint(path)
    config = infer_config(state, text_heads=text_heads, vision_heads=vision_heads, eos_token_id=eos_token_id,
                          bos_token_id=bos_token_id, pad_token_id=pad_token_id)
    model = CLIPModel(config)
    converted = convert_state_dict(state)
    missing, unexpected = model.load_state_dict(converted, strict=False)
    missing = [k for k in missing if not k.endswith("position_ids")]
    if missing or unexpected:
        raise KeyError(f"{path}: CLIPModel keys missing after conversion: {missing[:8]}; unexpected: {unexpected[:8]}")
    return model.eval().requires_grad_(False)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description="open_clip CLIP checkpoint -> transformers CLIPModel directory")
    parser.add_argument("--checkpoint", required=True, help="open_clip .pt (e.g. HPS_v2.1_compressed.pt)")
    parser.add_argument("--out", required=True, help="output directory (save_pretrained)")
    parser.add_argument("--text-heads", type=int, default=16)
    parser.add_argument("--vision-heads", type=int, default=16)
    parser.add_argument("--processor", help="tokenizer whose BOS/EOS/PAD ids the text tower uses (default: the "
                                            "OpenAI CLIP BPE ids 49406/49407/0)")
    args = parser.parse_args(argv)
    ids = {}
    if args.processor:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(args.processor)
        ids = dict(eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id, pad_token_id=tok.pad_token_id or 0)
    load_open_clip_as_hf(args.checkpoint, text_heads=args.text_heads, vision_heads=args.vision_heads, **ids
                         ).save_pretrained(args.out)
    print(f"saved CLIPModel to {args.out}; pair it with the processor of laion/CLIP-ViT-H-14-laion2B-s32B-b79K")


if __name__ == "__main__":
    main()
