"""DeepGen model layer: `build_model` (config + checkpoint -> `DeepGen`) and the `Conditioning` it produces."""

from .build import ModelPathError, build_model
from .deepgen.conditioning import Conditioning
from .deepgen.model import DeepGen, fused_layer_indices

__all__ = ["Conditioning", "DeepGen", "ModelPathError", "build_model", "fused_layer_indices"]
