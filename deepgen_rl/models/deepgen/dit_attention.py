"""Joint attention for diffusers' ``SD3Transformer2DModel`` that hides pad text rows as keys.

An SD3 joint block attends over [image tokens (N) ; text rows (L)] in one softmax. A batch of prompts of different
lengths right-pads the shorter ones; unmasked, those pad rows (the context embedder's bias after a zero input) would
take part in every image token's softmax, so a prompt's velocity would depend on its batch. Here every query sees
only the keys [all N image tokens ; the real text rows of its own prompt]:

    attn_mask[b, 0, 0, :] = [True]*N ++ text_key_mask[b]        (bool (B, 1, 1, N+L); True = may be attended to)
    out = softmax(q·kᵀ/√d + log attn_mask) · v                   (masked keys get weight exactly 0)

so the image stream equals that of the DiT fed only the prompt's real rows. Pad rows as *queries* are still
computed (their outputs are never read: the last joint block drops the text stream). The image-only second
attention of SD3.5's dual-attention layers (``attn2``, called without ``encoder_hidden_states``) has no text keys
and runs unmasked. Install with :func:`use_text_masked_attention`; pass the mask as
``joint_attention_kwargs={"text_key_mask": mask}`` (done by ``DeepGen.predict_velocity``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from diffusers.models.attention_processor import Attention
from torch import nn


class TextMaskedJointAttnProcessor:
    """Processor for SD3 ``Attention`` modules (joint ``attn`` and image-only ``attn2``).

    Same projections, q/k RMS norms and output projections as diffusers' ``JointAttnProcessor2_0``; the one
    difference is the optional boolean key mask over the text rows. Shapes: hidden_states (B, N, D),
    encoder_hidden_states (B, L, D) or None, text_key_mask (B, L) bool or None (None = every row is real).
    Returns (image (B, N, D), text (B, L, D)) for joint attention, image (B, N, D) otherwise.
    """

    def __call__(self, attn: Attention, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor | None = None,
                 attention_mask: torch.Tensor | None = None, text_key_mask: torch.Tensor | None = None):
        if attention_mask is not None:
            raise ValueError("TextMaskedJointAttnProcessor takes text_key_mask (B, L), not attention_mask")
        batch, num_image = hidden_states.shape[:2]

        def heads(t: torch.Tensor) -> torch.Tensor:  # (B, S, H·d) -> (B, H, S, d)
            return t.view(batch, t.shape[1], attn.heads, -1).transpose(1, 2)

        query = heads(attn.to_q(hidden_states))
        key, value = heads(attn.to_k(hidden_states)), heads(attn.to_v(hidden_states))
        if attn.norm_q is not None:
            query = attn.norm_q(query)
        if attn.norm_k is not None:
            key = attn.norm_k(key)
        mask = None
        if encoder_hidden_states is not None:
            ctx_q = heads(attn.add_q_proj(encoder_hidden_states))
            ctx_k = heads(attn.add_k_proj(encoder_hidden_states))
            ctx_v = heads(attn.add_v_proj(encoder_hidden_states))
            if attn.norm_added_q is not None:
                ctx_q = attn.norm_added_q(ctx_q)
            if attn.norm_added_k is not None:
                ctx_k = attn.norm_added_k(ctx_k)
            query, key, value = (torch.cat([query, ctx_q], dim=2), torch.cat([key, ctx_k], dim=2),
                                 torch.cat([value, ctx_v], dim=2))
            if text_key_mask is not None:
                if text_key_mask.shape != encoder_hidden_states.shape[:2]:
                    raise ValueError(f"text_key_mask {tuple(text_key_mask.shape)} does not match the text rows "
                                     f"{tuple(encoder_hidden_states.shape[:2])}")
                image_keys = torch.ones((batch, num_image), dtype=torch.bool, device=text_key_mask.device)
                mask = torch.cat([image_keys, text_key_mask.to(torch.bool)], dim=1)[:, None, None, :]
                mask = mask.to(query.device)
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=0.0, is_causal=False)
        out = out.transpose(1, 2).reshape(batch, -1, attn.heads * out.shape[-1]).to(query.dtype)
        image = attn.to_out[1](attn.to_out[0](out[:, :num_image]))
        if encoder_hidden_states is None:
            return image
        text = out[:, num_image:]
        if not attn.context_pre_only:
            text = attn.to_add_out(text)
        return image, text


_PROCESSOR = TextMaskedJointAttnProcessor()


def use_text_masked_attention(dit: nn.Module) -> None:
    """Give every diffusers ``Attention`` inside ``dit`` the text-masked processor (idempotent, cheap).

    Called by ``predict_velocity`` on whichever DiT it runs (the policy, a DeepSpeed engine's module, an EMA or
    reference copy, a DiT rebuilt from its config), so no caller has to remember it. A DiT with fused QKV
    projections is refused: this processor reads the separate ``to_q``/``to_k``/``to_v``.
    """
    for module in dit.modules():
        if isinstance(module, Attention) and not isinstance(module.processor, TextMaskedJointAttnProcessor):
            if getattr(module, "fused_projections", False):
                raise ValueError("the DiT has fused QKV projections; call unfuse_qkv_projections() before training "
                                 "(the text-masked attention reads to_q/to_k/to_v)")
            module.set_processor(_PROCESSOR)
