"""The frozen VLM LoRA of the DeepGen SFT checkpoint.

DeepGen SFT puts a PEFT LoRA on *every* ``nn.Linear`` and ``nn.Embedding`` of the Qwen2.5-VL model (vision tower,
merger, language model, ``lm_head``), adapter name ``default``. We inject the same adapter with peft so that the
checkpoint's ``…<module>.lora_A.default.weight`` / ``lora_embedding_A.default`` keys have a home; the base weights
move to ``…<module>.base_layer.weight``. The adapter is frozen in RL.
"""

from __future__ import annotations

import warnings

from torch import nn


def lora_target_names(lmm: nn.Module) -> list[str]:
    """Full module names of every Linear / Embedding in ``lmm`` (the SFT recipe's "auto" target list)."""
    return [name for name, module in lmm.named_modules() if isinstance(module, (nn.Linear, nn.Embedding))]


def apply_vlm_lora(lmm: nn.Module, rank: int, alpha: float) -> nn.Module:
    """Inject a LoRA adapter (r=rank, lora_alpha=alpha, adapter "default") into ``lmm`` in place.

    The fresh adapter is the identity (B=0); its weights come from the checkpoint. Returns ``lmm``.
    """
    from peft import LoraConfig, inject_adapter_in_model

    config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0, target_modules=lora_target_names(lmm))
    with warnings.catch_warnings():
        # Qwen2.5-VL-3B ties lm_head to embed_tokens; both get their own adapter, as in the SFT recipe.
        warnings.filterwarnings("ignore", message=".*tie_word_embeddings.*")
        inject_adapter_in_model(config, lmm, adapter_name="default")
    lmm.requires_grad_(False)
    return lmm
