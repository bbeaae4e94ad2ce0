"""DeepGen 1.0 model: VLM + Stacked Channel Bridging connector + SD3 DiT."""

from .conditioning import Conditioning
from .connector import Connector, ConnectorConfig
from .model import DEFAULT_MAX_PROMPT_TOKENS, PROMPT_TEMPLATE, DeepGen, fused_layer_indices

__all__ = ["Conditioning", "Connector", "ConnectorConfig", "DEFAULT_MAX_PROMPT_TOKENS", "DeepGen", "PROMPT_TEMPLATE",
           "fused_layer_indices"]
