"""SFT-auxiliary loss: real image–caption data (mmengine dataset config) and the flow-matching loss glue.

``SFTAuxiliary(config_path, model, rank=, world_size=, seed=, micro_batch_size=)`` is what the trainer uses;
``build_sft_loader`` / ``sft_aux_loss`` are the pieces (see data.py and loss.py).
"""

from .data import SFTLoader, WeightedMixtureSampler, build_sft_loader, load_sft_config
from .loss import SFTAuxiliary, sample_sigmas, sft_aux_loss

__all__ = ["SFTAuxiliary", "SFTLoader", "WeightedMixtureSampler", "build_sft_loader", "load_sft_config",
           "sample_sigmas", "sft_aux_loss"]
