"""DeepGen 1.0 model: VLM + Stacked Channel Bridging connector + SD3 DiT."""

from .conditioning import Conditioning
from .connector import Connector, ConnectorConfig
from .model import PROMPT_TEMPLATE, DeepGen, fused_layer_indices

__all__ = ["Conditioning", "Connector", "ConnectorConfig", "DeepGen", "PROMPT_TEMPLATE", "fused_layer_indices"]
