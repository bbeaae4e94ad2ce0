"""Tiny random DeepGen for CPU tests, saved in the real models' folder layout.

`make_tiny_deepgen(out_dir)` writes

    out_dir/qwen/              Qwen2_5_VLForConditionalGeneration + fast BPE tokenizer (save_pretrained)
    out_dir/sd3/transformer/   SD3Transformer2DModel
    out_dir/sd3/vae/           AutoencoderKL (x8, 16 latent channels, SD3 scaling/shift)
    out_dir/sd3/scheduler/     FlowMatchEulerDiscreteScheduler(shift=3.0)
    out_dir/deepgen_tiny.pth   DeepGen SFT-layout checkpoint (VLM LoRA, connector, projectors with non-zero
                               projector_2/3, meta_queries, transformer.*), in the older transformers-4.51 key
                               layout so that every load exercises the key map

so that ``configs/models/deepgen_tiny.py`` loads it through the same ``from_pretrained`` path as the real model.
Everything is a function of (preset, seed). `ensure_tiny_deepgen()` builds it once into `tiny_dir()`.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from typing import Any

import torch

CACHE_VERSION = "v1"
SEED = 0
DONE_MARKER = "tiny_paths.json"

QWEN_SPECIAL_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>",
]

# Sizes per preset. "tiny": whole model ~1.1 M params, for unit tests. "small": a ~20 M-param DiT so that DiT
# compute dominates a CPU benchmark: build_model("configs/models/deepgen_tiny.py", tiny_preset="small").
# The "deepgen" keys of the preset override the model config's; "tiny"'s mirror configs/models/deepgen_tiny.py.
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(
        text=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=13, num_attention_heads=4,
                  num_key_value_heads=2, mrope_section=[2, 3, 3]),
        vision=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2),
        dit=dict(num_layers=2, num_attention_heads=2, attention_head_dim=16, joint_attention_dim=64,
                 caption_projection_dim=32, pooled_projection_dim=64, dual_attention_layers=(0,)),
        vae=dict(block_out_channels=(16, 16, 32, 32), norm_num_groups=8),
        deepgen=dict(connector=dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128),
                     num_queries=16, max_prompt_tokens=64, lora_rank=4, lora_alpha=8),
    ),
    "small": dict(
        text=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=13, num_attention_heads=4,
                  num_key_value_heads=2, mrope_section=[2, 3, 3]),
        vision=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2),
        dit=dict(num_layers=8, num_attention_heads=4, attention_head_dim=64, joint_attention_dim=128,
                 caption_projection_dim=256, pooled_projection_dim=128, dual_attention_layers=(0, 1)),
        vae=dict(block_out_channels=(32, 32, 64, 64), norm_num_groups=16),
        deepgen=dict(connector=dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256),
                     num_queries=32, max_prompt_tokens=64, lora_rank=4, lora_alpha=8),
    ),
}

_CORPUS = """
A photo of a red apple on a wooden table next to a glass of water. A small black cat sleeps on a blue sofa in the
living room while the morning light comes through the window. Two dogs run across a green field under a clear sky.
A tall building with many windows stands in the center of a busy city street at night, with cars and people.
An old man reads a book in the park; a young woman rides a bicycle along the river. The sign above the door says
OPEN in bright yellow letters. A bowl of soup, a plate of bread and three oranges are on the kitchen counter.
Generate an image of a mountain lake with snow on the peaks and pine trees around the water. A white horse stands
beside a brown fence. A child holds a balloon shaped like a star. There is a clock on the wall showing ten past
nine. A painting of flowers in a vase, in the style of an oil painting with thick brush strokes. A robot made of
shiny metal waves at the camera. The beach has soft sand, small shells and gentle waves; a boat is far away.
A cup of coffee with a heart drawn in the foam sits beside a laptop and a notebook. Four birds sit on a wire.
A close-up portrait of a smiling girl with curly hair and round glasses. A bridge over a quiet river at sunset,
orange and purple clouds reflected in the water. A green frog on a leaf after the rain. The word HELLO written in
chalk on a blackboard. A red car parked in front of a small house with a garden full of roses and tulips.
A person is cooking pasta; steam rises from the pot. An astronaut floats in space above the earth. A cake with
five candles, a gift box and colorful paper on the table. The left side is dark and the right side is bright.
A large elephant walks slowly through the dry grass while a bird sits on its back. A pixel art castle.
"""


def tiny_dir(preset: str = "tiny") -> str:
    """Cache folder of a preset: ``$DEEPGEN_TINY_DIR`` (+ ``-<preset>`` for other presets) or
    ``~/.cache/deepgen_rl/<preset>-v1``."""
    base = os.environ.get("DEEPGEN_TINY_DIR")
    if base:
        return base if preset == "tiny" else f"{base}-{preset}"
    return os.path.join(os.path.expanduser("~"), ".cache", "deepgen_rl", f"{preset}-{CACHE_VERSION}")


def tiny_paths(root: str) -> dict[str, str]:
    root = os.path.abspath(root)
    return {"root": root, "qwen": os.path.join(root, "qwen"), "sd3": os.path.join(root, "sd3"),
            "checkpoint": os.path.join(root, "deepgen_tiny.pth")}


def _is_current(root: str, preset: str) -> bool:
    try:
        with open(os.path.join(root, DONE_MARKER)) as f:
            meta = json.load(f)
    except (OSError, ValueError):
        return False
    return meta.get("version") == CACHE_VERSION and meta.get("preset") == preset


def ensure_tiny_deepgen(preset: str = "tiny") -> dict[str, str]:
    """Paths of the cached tiny model, building it first if needed (or if the cache is from another CACHE_VERSION).

    Safe when several processes race: each builds into its own temp folder next to the cache and renames it into
    place; a loser discards its copy and uses the winner's.
    """
    root = tiny_dir(preset)
    if _is_current(root, preset):
        return tiny_paths(root)
    parent = os.path.dirname(os.path.abspath(root))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(root)}.tmp-", dir=parent)
    stale = f"{tmp}-stale"
    try:
        make_tiny_deepgen(tmp, preset=preset)
        try:
            os.rename(tmp, root)
        except OSError:
            if not _is_current(root, preset):
                if not os.path.isfile(os.path.join(root, DONE_MARKER)):
                    raise  # not ours to replace: some unrelated non-empty folder
                try:  # an outdated cache: move it aside, then retry (another process may do the same)
                    os.rename(root, stale)
                except OSError:
                    pass
                try:
                    os.rename(tmp, root)
                except OSError:
                    if not _is_current(root, preset):
                        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(stale, ignore_errors=True)
    return tiny_paths(root)


def make_tiny_deepgen(out_dir: str, preset: str = "tiny", seed: int = SEED) -> dict[str, str]:
    """Write a random DeepGen of ``preset`` size to ``out_dir`` (see module docstring); returns its paths
    (``root``, ``qwen``, ``sd3``, ``checkpoint``)."""
    from diffusers import SD3Transformer2DModel

    spec = PRESETS[preset]
    paths = tiny_paths(out_dir)
    os.makedirs(out_dir, exist_ok=True)

    write_random_qwen(paths["qwen"], train_bpe_tokenizer(_corpus_lines(), vocab_size=1000), spec["text"],
                      spec["vision"], vocab_size=1024, max_position_embeddings=2048, rope_theta=1e6, seed=seed)
    torch.manual_seed(seed + 1)
    SD3Transformer2DModel(sample_size=32, patch_size=2, in_channels=16, out_channels=16, pos_embed_max_size=32,
                          qk_norm="rms_norm", **spec["dit"]).save_pretrained(os.path.join(paths["sd3"], "transformer"))
    torch.manual_seed(seed + 2)
    write_vae_and_scheduler(paths["sd3"], spec["vae"], scaling_factor=1.5305, shift_factor=0.0609)

    _write_sft_checkpoint(paths, spec["deepgen"], seed)
    with open(os.path.join(out_dir, DONE_MARKER), "w") as f:
        json.dump({"preset": preset, "seed": seed, "version": CACHE_VERSION}, f)
    return paths


def _corpus_lines() -> list[str]:
    return [line for line in _CORPUS.splitlines() if line.strip()]


def train_bpe_tokenizer(corpus: list[str], vocab_size: int):
    """A byte-level BPE tokenizer (at most ``vocab_size`` tokens) trained on ``corpus``, holding the Qwen special
    tokens: the tiny model's and the toy model's."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=QWEN_SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(corpus, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   model_max_length=4096)


def write_random_qwen(path: str, tokenizer, text: dict[str, Any], vision: dict[str, Any], *, vocab_size: int,
                      max_position_embeddings: int, rope_theta: float, seed: int) -> None:
    """Save ``tokenizer`` and a random ``Qwen2_5_VLForConditionalGeneration`` (text and vision sizes from ``text``,
    with its ``mrope_section``, and ``vision``; weights from ``torch.manual_seed(seed)``) into ``path``."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    tokenizer.save_pretrained(path)
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in QWEN_SPECIAL_TOKENS}
    text = dict(text)
    mrope = text.pop("mrope_section")
    config = Qwen2_5_VLConfig(
        text_config=dict(text, vocab_size=vocab_size, max_position_embeddings=max_position_embeddings,
                         tie_word_embeddings=True,
                         rope_parameters=dict(rope_type="default", rope_theta=rope_theta, mrope_section=mrope),
                         bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"],
                         pad_token_id=ids["<|endoftext|>"]),
        vision_config=dict(vision, out_hidden_size=text["hidden_size"], fullatt_block_indexes=[0],
                           patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=112),
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    Qwen2_5_VLForConditionalGeneration(config).save_pretrained(path)


def write_vae_and_scheduler(sd3_dir: str, vae: dict[str, Any], scaling_factor: float, shift_factor: float) -> None:
    """Save a random ``AutoencoderKL`` (16 latent channels, one layer per block, sizes from ``vae``; torch's global
    RNG) and the flow-matching scheduler (shift 3) into ``sd3_dir``'s ``vae`` and ``scheduler`` folders."""
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler

    blocks = len(vae["block_out_channels"])
    AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * blocks,
                  up_block_types=("UpDecoderBlock2D",) * blocks, layers_per_block=1, latent_channels=16,
                  sample_size=64, scaling_factor=scaling_factor, shift_factor=shift_factor, use_quant_conv=False,
                  use_post_quant_conv=False, **vae).save_pretrained(os.path.join(sd3_dir, "vae"))
    FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0).save_pretrained(
        os.path.join(sd3_dir, "scheduler"))


def _write_sft_checkpoint(paths: dict[str, str], deepgen_cfg: dict[str, Any], seed: int) -> None:
    """Checkpoint in the DeepGen SFT layout with every non-base tensor random (so each key matters)."""
    from .assemble import build_from_config
    from deepgen_rl.checkpoints.sft import export_sft_state_dict

    cfg = dict(deepgen_cfg, lmm_path=paths["qwen"], sd3_path=paths["sd3"], dtype="float32", init_seed=seed + 3)
    model = build_from_config(cfg)
    gen = torch.Generator().manual_seed(seed + 4)
    with torch.no_grad():
        for proj in (model.projector_2, model.projector_3):
            proj.weight.copy_(torch.randn(proj.weight.shape, generator=gen) / proj.weight.shape[1] ** 0.5)
            proj.bias.copy_(0.02 * torch.randn(proj.bias.shape, generator=gen))
        for name, param in model.lmm.named_parameters():
            if ".lora_" in name:
                param.copy_(0.05 * torch.randn(param.shape, generator=gen))
    torch.save(export_sft_state_dict(model, legacy=True), paths["checkpoint"])
