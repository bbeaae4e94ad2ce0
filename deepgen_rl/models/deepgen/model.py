"""DeepGen 1.0: Qwen2.5-VL (frozen) → Stacked Channel Bridging → SD3.5-Medium DiT (trained in RL).

Attribute names follow the DeepGen SFT checkpoint layout so its state dict loads through an explicit key map
(`deepgen_rl.checkpoints.sft`). Build it with `deepgen_rl.models.build_model`, not by hand.
"""

from __future__ import annotations

import logging
import math
from typing import Sequence

import torch
from torch import nn

from .conditioning import Conditioning
from .connector import Connector, ConnectorConfig
from .cpu_gelu import ensure_cpu_fast_gelu
from .dit_attention import use_text_masked_attention

logger = logging.getLogger(__name__)

PROMPT_TEMPLATE = "<|im_start|>user\nGenerate an image: {prompt}<|im_end|>\n<|im_start|>assistant\n"
# Everything from the end of the user's prompt on; kept intact when a long prompt is truncated.
_TEMPLATE_SUFFIX_MARKER = "{prompt}"
FUSION_STRIDE = 6
# Text tokens per prompt (template included) before a prompt is truncated: the one home of this default, used by
# ``DeepGen`` and by ``build_from_config`` when a model config omits ``max_prompt_tokens``. 1024 fits every prompt of
# the recipe's measured files with a margin (docs/recipe.md, "Model: prompt length"; bench/prompt_rows.py NEW_LIMIT;
# tests/models/test_prompt_limit.py ties the three together).
DEFAULT_MAX_PROMPT_TOKENS = 1024


def fused_layer_indices(num_layers: int, stride: int = FUSION_STRIDE) -> list[int]:
    """Indices into ``hidden_states`` (0 = embedding output, i = output of decoder layer i) that are fused.

    Every ``stride``-th layer counting back from the second-to-last decoder layer, deepest first:
    36 layers -> [35, 29, 23, 17, 11, 5]; 13 -> [12, 6]. Their number is ceil((num_layers - 1) / stride).
    """
    if num_layers < 2:
        raise ValueError(f"need at least 2 decoder layers to fuse, got {num_layers}")
    indices = list(range(num_layers - 1, 0, -stride))
    assert len(indices) == math.ceil((num_layers - 1) / stride)
    return indices


def guided_velocity(model, latents: torch.Tensor, sigma: torch.Tensor, cond: Conditioning,
                    uncond: Conditioning | None = None, cfg_scale: float = 0.0,
                    transformer: nn.Module | None = None) -> torch.Tensor:
    """Classifier-free guidance on :meth:`DeepGen.predict_velocity` (rollout, training and evaluation all call this):
    v = v_c (cfg_scale <= 1 or no uncond) or v_u + s (v_c - v_u), both branches in ONE batched DiT forward.

    latents (B, 16, h, w), sigma (B,); ``cond`` is the per-image Conditioning (B rows); ``uncond`` a Conditioning
    with one row (broadcast) or B rows. ``model`` is anything with ``predict_velocity`` (a DeepGen, a test double).
    """
    if uncond is None or cfg_scale <= 1.0:
        return model.predict_velocity(latents, sigma, cond, transformer=transformer)
    b = latents.shape[0]
    both = type(cond).cat([cond, uncond.repeat_interleave(b) if len(uncond) == 1 else uncond])
    v = model.predict_velocity(torch.cat([latents, latents]), torch.cat([sigma, sigma]), both, transformer=transformer)
    v_c, v_u = v[:b], v[b:]
    return v_u + cfg_scale * (v_c - v_u)


class DeepGen(nn.Module):
    """Text-to-image DeepGen model with batch-invariant prompt conditioning.

    Conditioning pipeline for B prompts (n_b = templated length of prompt b, T = max_b n_b ≤ max_prompt_tokens,
    Q = num_queries, H = VLM width, K = fused layers):
      1. tokens = template(prompt), right-padded to T, the longest prompt of the batch (a prompt longer than
         ``max_prompt_tokens`` loses the end of the user text, keeps the template tail
         ``<|im_end|>\\n<|im_start|>assistant\\n``, is counted in ``num_truncated_prompts`` and logged).
      2. VLM input = [prompt (n tokens)] [Q think tokens = meta_queries] [T - n pads]; positions 0 … n+Q-1 then
         continuing (text-only mRoPE: same position on all 3 axes); attention mask hides the pads.
      3. fused = concat of hidden_states[fused_layer_indices(L)] on channels (B, T+Q, K·H);
         x = connector(projector_1(fused), key_mask=valid).
      4. prompt_embeds = projector_3(x) with pad positions set to 0 (B, T+Q, joint_dim), text_mask = valid (B, T+Q);
         pooled_embeds = projector_2(mean of x over the n+Q valid tokens) (B, pooled_dim).
      5. ``predict_velocity`` drops all-pad columns and masks the remaining pad rows as keys in the DiT's joint
         attention (``dit_attention.TextMaskedJointAttnProcessor``).

    Why: the reference left-pads to the longest prompt of the batch and passes pads unmasked through the connector
    and the DiT, so a prompt's conditioning changes with its batch-mates. Here every step masks the pads, so each
    prompt's velocity equals that of the DiT fed exactly its n + Q rows alone — what the SFT model was trained on —
    and the DiT's cost follows the batch's longest prompt, not a fixed ``max_prompt_tokens``.
    """

    def __init__(
        self,
        lmm: nn.Module,
        tokenizer,
        transformer: nn.Module,
        vae: nn.Module,
        scheduler,
        connector_config: ConnectorConfig,
        num_queries: int = 128,
        max_prompt_tokens: int = DEFAULT_MAX_PROMPT_TOKENS,
        prompt_template: str = PROMPT_TEMPLATE,
    ):
        super().__init__()
        self.lmm = lmm
        self.tokenizer = tokenizer
        self.transformer = transformer
        self.vae = vae
        self.scheduler = scheduler
        self.num_queries = num_queries
        self.max_prompt_tokens = max_prompt_tokens
        if _TEMPLATE_SUFFIX_MARKER not in prompt_template:
            raise ValueError(f"prompt_template must contain {{prompt}}: {prompt_template!r}")
        self.prompt_template = prompt_template
        self.num_truncated_prompts = 0

        text_config = lmm.config.get_text_config()
        hidden = text_config.hidden_size
        self.fused_layers = fused_layer_indices(text_config.num_hidden_layers)
        self.connector = Connector(connector_config)
        width = connector_config.hidden_size
        self.projector_1 = nn.Linear(hidden * len(self.fused_layers), width)
        self.projector_2 = nn.Linear(width, transformer.config.pooled_projection_dim)
        self.projector_3 = nn.Linear(width, transformer.config.joint_attention_dim)
        for proj in (self.projector_2, self.projector_3):
            nn.init.zeros_(proj.weight)
            nn.init.zeros_(proj.bias)
        self.meta_queries = nn.Parameter(torch.randn(num_queries, hidden) / math.sqrt(hidden))
        self._frozen = False
        # True: predict_velocity computes the DiT's tanh GELUs of CPU tensors as x·sigmoid(2u) (cpu_gelu.py; the
        # trainer's --cpu_fast_gelu): the same function to float rounding, ~3x faster on an AVX2 CPU
        self.cpu_fast_gelu = False

    # ------------------------------------------------------------------ properties
    @property
    def device(self) -> torch.device:
        return self.meta_queries.device

    @property
    def dtype(self) -> torch.dtype:
        return self.meta_queries.dtype

    @property
    def scheduler_shift(self) -> float:
        return float(self.scheduler.config.shift)

    def latent_shape(self, height: int, width: int) -> tuple[int, int, int]:
        """(C, h, w) of the DiT latents for an image of (height, width) pixels."""
        factor = 2 ** (len(self.vae.config.block_out_channels) - 1)
        return (self.vae.config.latent_channels, height // factor, width // factor)

    # ------------------------------------------------------------------ training setup
    def trainable_parameters(self) -> list[nn.Parameter]:
        """The DiT's parameters: the only part trained in RL."""
        return list(self.transformer.parameters())

    def _frozen_modules(self) -> list[nn.Module]:
        return [self.lmm, self.connector, self.projector_1, self.projector_2, self.projector_3, self.vae]

    def freeze_non_trainable(self) -> None:
        """requires_grad=False and eval() for everything but the DiT (stays so across later ``train()`` calls)."""
        for module in self._frozen_modules():
            module.requires_grad_(False)
            module.eval()
        self.meta_queries.requires_grad_(False)
        self._frozen = True

    def train(self, mode: bool = True) -> "DeepGen":
        super().train(mode)
        if self._frozen:
            for module in self._frozen_modules():
                module.eval()
        return self

    def enable_gradient_checkpointing(self) -> None:
        self.transformer.enable_gradient_checkpointing()

    # ------------------------------------------------------------------ prompts -> conditioning
    def _tokenize(self, prompts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Templated token ids right-padded to the batch's longest (≤ max_prompt_tokens).

        Returns ((B, T) long ids, (B,) long lengths).
        """
        limit = self.max_prompt_tokens
        suffix = self.prompt_template.split(_TEMPLATE_SUFFIX_MARKER, 1)[1]
        suffix_ids = self.tokenizer(suffix, add_special_tokens=False)["input_ids"]
        texts = [self.prompt_template.format(prompt=p) for p in prompts]
        rows = self.tokenizer(texts, add_special_tokens=False)["input_ids"]
        pad_id = self.tokenizer.pad_token_id
        if pad_id is None:
            pad_id = self.tokenizer.eos_token_id or 0
        width = min(limit, max(len(row) for row in rows))
        ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
        lengths = torch.empty(len(rows), dtype=torch.long)
        truncated = 0
        for i, row in enumerate(rows):
            if len(row) > limit:
                truncated += 1
                row = row[: limit - len(suffix_ids)] + suffix_ids
            ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
            lengths[i] = len(row)
        if truncated:
            self.num_truncated_prompts += truncated
            logger.warning("truncated %d prompt(s) to max_prompt_tokens=%d (%d so far)", truncated, limit,
                           self.num_truncated_prompts)
        return ids, lengths

    def _text_model(self) -> nn.Module:
        # transformers >= 4.52 nests the decoder as model.language_model; 4.51 had it at model.
        inner = self.lmm.model
        return getattr(inner, "language_model", inner)

    @torch.no_grad()
    def encode_prompts(self, prompts: Sequence[str]) -> Conditioning:
        """Conditioning for ``prompts`` (see the class docstring), in the model's dtype, on its device.

        prompt_embeds (B, T + num_queries, joint_dim) with T the batch's longest templated prompt,
        text_mask (B, T + num_queries) bool, pooled_embeds (B, pooled_dim).
        """
        prompts = list(prompts)
        if not prompts:
            raise ValueError("encode_prompts needs at least one prompt")
        device, dtype = self.device, self.dtype
        ids, lengths = self._tokenize(prompts)
        ids, lengths = ids.to(device), lengths.to(device)
        b, t = ids.shape
        q = self.num_queries
        s = t + q

        token_embeds = self.lmm.get_input_embeddings()(ids).to(dtype)  # (B, T, H): [prompt][pads]
        stacked = torch.cat([token_embeds, self.meta_queries[None].expand(b, q, -1).to(dtype)], dim=1)
        # Reorder each row to [prompt][think][pads]: position p reads source index src[b, p] of `stacked`.
        pos = torch.arange(s, device=device)[None].expand(b, s)
        n = lengths[:, None]
        src = torch.where(pos < n, pos, torch.where(pos < n + q, t + pos - n, pos - q))
        inputs_embeds = stacked.gather(1, src[..., None].expand(b, s, stacked.shape[-1]))
        valid = pos < n + q  # (B, S) bool
        position_ids = pos[None].expand(3, b, s)

        out = self._text_model()(inputs_embeds=inputs_embeds, attention_mask=valid.long(), position_ids=position_ids,
                                 use_cache=False, output_hidden_states=True)
        fused = torch.cat([out.hidden_states[i] for i in self.fused_layers], dim=-1)
        x = self.connector(self.projector_1(fused), key_mask=valid)
        mask = valid[..., None]
        # Mean in fp32: bf16 cannot even count 257+ valid tokens exactly.
        mean = (x.float() * mask).sum(1) / mask.sum(1)
        pooled = self.projector_2(mean.to(x.dtype))
        seq = self.projector_3(x) * mask.to(x.dtype)
        return Conditioning(prompt_embeds=seq, pooled_embeds=pooled, text_mask=valid)

    # ------------------------------------------------------------------ DiT
    def predict_velocity(self, latents: torch.Tensor, sigma: torch.Tensor, cond: Conditioning,
                         transformer: nn.Module | None = None) -> torch.Tensor:
        """DiT output v(x_σ, σ, c) ≈ ε − x₀ for latents (B, 16, h, w) at noise level sigma (B,) in [0, 1].

        The DiT gets timestep σ·1000 (fp32) and runs in its own dtype; the result is cast to ``latents.dtype``.
        ``transformer`` overrides ``self.transformer`` (an EMA copy, a DeepSpeed engine's module, a frozen reference).
        Pad text rows of ``cond`` never reach the image stream: all-pad columns are dropped and, if the rows still
        differ in length, the DiT's joint attention masks the pad rows as keys (``use_text_masked_attention``).
        With ``self.cpu_fast_gelu`` the DiT's tanh GELUs run as x·sigmoid(2u) on the CPU (``cpu_gelu``).
        """
        dit = self.transformer if transformer is None else transformer
        if self.cpu_fast_gelu:
            ensure_cpu_fast_gelu(dit)
        dit_dtype = _module_dtype(dit)
        b = latents.shape[0]
        sigma = torch.as_tensor(sigma, device=latents.device, dtype=torch.float32).reshape(-1).expand(b)
        if len(cond) != b:
            raise ValueError(f"conditioning has {len(cond)} rows, latents {b}")
        cond = cond.trimmed()
        extra = {}
        if cond.text_mask is not None:
            use_text_masked_attention(dit)
            extra["joint_attention_kwargs"] = {"text_key_mask": cond.text_mask.to(latents.device)}
        out = dit(
            hidden_states=latents.to(dit_dtype),
            encoder_hidden_states=cond.prompt_embeds.to(device=latents.device, dtype=dit_dtype),
            pooled_projections=cond.pooled_embeds.to(device=latents.device, dtype=dit_dtype),
            timestep=sigma * 1000.0,
            return_dict=False,
            **extra,
        )[0]
        return out.to(latents.dtype)

    # ------------------------------------------------------------------ VAE
    @torch.no_grad()
    def decode_latents(self, latents: torch.Tensor) -> torch.Tensor:
        """Latents (B, 16, h, w) -> fp32 images in [0, 1] (B, 3, 8h, 8w); x = D(z / scale + shift)."""
        cfg = self.vae.config
        z = latents.to(_module_dtype(self.vae)) / cfg.scaling_factor + (cfg.shift_factor or 0.0)
        images = self.vae.decode(z, return_dict=False)[0]
        return ((images.float() + 1.0) / 2.0).clamp(0.0, 1.0)

    @torch.no_grad()
    def encode_images(self, images: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Images in [0, 1] (B, 3, H, W) -> fp32 latents z = (E(x) − shift)·scale.

        E(x) is the posterior mean (deterministic) unless ``generator`` is given, then a posterior sample.
        """
        cfg = self.vae.config
        x = images.to(device=self.device, dtype=_module_dtype(self.vae)) * 2.0 - 1.0
        posterior = self.vae.encode(x, return_dict=False)[0]
        z = posterior.mode() if generator is None else posterior.sample(generator=generator)
        return ((z.float() - (cfg.shift_factor or 0.0)) * cfg.scaling_factor)


def _module_dtype(module: nn.Module) -> torch.dtype:
    dtype = getattr(module, "dtype", None)
    if isinstance(dtype, torch.dtype):
        return dtype
    return next(module.parameters()).dtype
