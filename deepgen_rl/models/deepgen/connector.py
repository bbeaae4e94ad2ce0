"""Stacked-Channel-Bridging connector: a small bidirectional pre-LN transformer encoder.

It sits between the VLM's fused hidden states (after ``projector_1``) and the DiT's conditioning projections
(``projector_2`` / ``projector_3``). Parameter names follow the DeepGen SFT checkpoint
(``connector.layers.N.{layer_norm1,self_attn.{q,k,v,out}_proj,layer_norm2,mlp.fc1,mlp.fc2}``) so its weights load
without renaming.

Per layer (x: (B, L, D)):
    x = x + out_proj(attn(LN1(x)))          # bidirectional, optional key-padding mask, no positional encoding
    x = x + fc2(gelu_tanh(fc1(LN2(x))))
There is no final norm.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint


@dataclass(frozen=True)
class ConnectorConfig:
    """Connector shape. The real DeepGen connector: width 2048, 6 layers, 32 heads, MLP 11946."""

    hidden_size: int = 2048
    num_hidden_layers: int = 6
    num_attention_heads: int = 32
    intermediate_size: int = 11946
    layer_norm_eps: float = 1e-6


class ConnectorAttention(nn.Module):
    def __init__(self, config: ConnectorConfig):
        super().__init__()
        width, heads = config.hidden_size, config.num_attention_heads
        if width % heads:
            raise ValueError(f"connector width {width} is not divisible by {heads} heads")
        self.num_heads = heads
        self.head_dim = width // heads
        self.q_proj = nn.Linear(width, width)
        self.k_proj = nn.Linear(width, width)
        self.v_proj = nn.Linear(width, width)
        self.out_proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None) -> torch.Tensor:
        """x: (B, L, D); attn_mask: None or bool (B, 1, 1, L), True = this key may be attended to."""
        b, n, d = x.shape

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(b, n, self.num_heads, self.head_dim).transpose(1, 2)

        out = F.scaled_dot_product_attention(heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x)),
                                             attn_mask=attn_mask)
        return self.out_proj(out.transpose(1, 2).reshape(b, n, d))


class ConnectorMLP(nn.Module):
    def __init__(self, config: ConnectorConfig):
        super().__init__()
        self.fc1 = nn.Linear(config.hidden_size, config.intermediate_size)
        self.fc2 = nn.Linear(config.intermediate_size, config.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class ConnectorLayer(nn.Module):
    def __init__(self, config: ConnectorConfig):
        super().__init__()
        self.layer_norm1 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.self_attn = ConnectorAttention(config)
        self.layer_norm2 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.mlp = ConnectorMLP(config)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None) -> torch.Tensor:
        x = x + self.self_attn(self.layer_norm1(x), attn_mask)
        return x + self.mlp(self.layer_norm2(x))


class Connector(nn.Module):
    """Bidirectional encoder over the (projected) fused VLM hidden states.

    forward(x (B, L, D), key_mask (B, L) bool or None) -> (B, L, D). With ``key_mask`` no token attends to masked
    keys; outputs at masked positions are still computed (they only see valid keys) and the caller discards them.
    """

    def __init__(self, config: ConnectorConfig):
        super().__init__()
        self.config = config
        self.layers = nn.ModuleList(ConnectorLayer(config) for _ in range(config.num_hidden_layers))
        self.gradient_checkpointing = False
        self.apply(_init_weights)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor | None = None) -> torch.Tensor:
        attn_mask = None if key_mask is None else key_mask[:, None, None, :].to(torch.bool)
        for layer in self.layers:
            if self.gradient_checkpointing and self.training:
                x = checkpoint(layer, x, attn_mask, use_reentrant=False)
            else:
                x = layer(x, attn_mask)
        return x


def _init_weights(module: nn.Module) -> None:
    # Only matters for fresh (tiny / test) models; real weights come from the SFT checkpoint.
    if isinstance(module, nn.Linear):
        nn.init.xavier_uniform_(module.weight)
        nn.init.zeros_(module.bias)
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)
