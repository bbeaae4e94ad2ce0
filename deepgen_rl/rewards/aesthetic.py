"""``aesthetic``: LAION aesthetic predictor -- a head on CLIP ViT-L/14 image embeddings.

Model: transformers ``CLIPModel`` (published: ``openai/clip-vit-large-patch14``) from
``$AESTHETIC_CLIP_MODEL_NAME_OR_PATH``
(falls back to ``$CLIP_MODEL_NAME_OR_PATH``); head weights from ``$AESTHETIC_HEAD_PATH`` (``head_path``), a ``.pth``
(read with ``weights_only=True``) or ``.safetensors`` state dict of either published head:

* MLP ("improved aesthetic predictor", e.g. ``sac+logos+ava1-l14-linearMSE.pth``): keys ``layers.{0,2,4,6,7}.*``,
  Linear(D,1024) → Dropout → Linear(1024,128) → Dropout → Linear(128,64) → Dropout → Linear(64,16) → Linear(16,1),
  no activations (as published);
* linear (aesthetic predictor v1, e.g. ``sa_0_4_vit_l_14_linear.pth``): keys ``weight`` [1, D], ``bias`` [1].

score = head(e / ‖e‖) with e = the projected CLIP image embedding (FloatTensor[D], D = 768 for ViT-L/14); the prompt
is not used. Range: unbounded in principle, about 1-10 (the AVA rating scale) on real images. Batch-size invariant.
"""
from __future__ import annotations

import os
import threading

import torch
from torch import nn

from .base import Reward, WeightPath, register_reward
from .clip_common import image_embeddings, load_clip, load_processor, resolve_path

ENV_VAR = "AESTHETIC_CLIP_MODEL_NAME_OR_PATH"
HEAD_ENV_VAR = "AESTHETIC_HEAD_PATH"


class AestheticMLP(nn.Module):
    """The LAION improved-aesthetic-predictor head (state-dict keys ``layers.{0,2,4,6,7}``)."""

    def __init__(self, input_size: int):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(input_size, 1024), nn.Dropout(0.2), nn.Linear(1024, 128),
                                    nn.Dropout(0.2), nn.Linear(128, 64), nn.Dropout(0.1), nn.Linear(64, 16),
                                    nn.Linear(16, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def load_head_state(path: str) -> dict[str, torch.Tensor]:
    if not path or not os.path.isfile(path):
        raise FileNotFoundError(f"aesthetic: head weights {path!r} not found; set ${HEAD_ENV_VAR} or pass head_path "
                                f"(a .pth or .safetensors state dict of the LAION aesthetic head)")
    if path.endswith(".safetensors"):
        from safetensors.torch import load_file

        return load_file(path)
    state = torch.load(path, map_location="cpu", weights_only=True)
    return state.get("state_dict", state) if isinstance(state, dict) else state


def build_head(state: dict[str, torch.Tensor], embed_dim: int, path: str) -> nn.Module:
    """The head matching ``state``'s keys (MLP or linear), loaded strictly; ValueError naming ``path`` otherwise."""
    if "layers.0.weight" in state:
        head = AestheticMLP(int(state["layers.0.weight"].shape[1]))
    elif set(state) == {"weight", "bias"}:
        head = nn.Linear(int(state["weight"].shape[1]), 1)
    else:
        raise ValueError(f"aesthetic: {path!r} (${HEAD_ENV_VAR}) holds keys {sorted(state)[:6]}..., expected the MLP "
                         f"head (layers.0.weight ...) or the linear head (weight, bias)")
    try:
        head.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise ValueError(f"aesthetic: head weights {path!r} (${HEAD_ENV_VAR}) do not fit: {exc}") from exc
    in_dim = head.layers[0].in_features if isinstance(head, AestheticMLP) else head.in_features
    if in_dim != embed_dim:
        raise ValueError(f"aesthetic: head {path!r} (${HEAD_ENV_VAR}) takes {in_dim}-dim embeddings but the CLIP model "
                         f"projects to {embed_dim} (use CLIP ViT-L/14 for the published heads)")
    return head.eval().requires_grad_(False)


@register_reward("aesthetic")
class AestheticReward(Reward):
    name = "aesthetic"
    weight_paths = (WeightPath("model_name_or_path", (ENV_VAR, "CLIP_MODEL_NAME_OR_PATH")),
                    WeightPath("head_path", (HEAD_ENV_VAR,), "file"))

    def __init__(self, model_name_or_path: str | None = None, head_path: str | None = None, *,
                 device: str | None = None, batch_size: int = 32, dtype: torch.dtype = torch.float32):
        path = resolve_path("aesthetic", model_name_or_path or os.environ.get("CLIP_MODEL_NAME_OR_PATH"), ENV_VAR)
        self.model = load_clip("aesthetic", path, ENV_VAR, dtype)
        _, self.image_processor = load_processor("aesthetic", path, ENV_VAR)
        head_path = head_path or os.environ.get(HEAD_ENV_VAR, "")
        self.head = build_head(load_head_state(head_path), int(self.model.config.projection_dim), head_path)
        self.device = torch.device(device or "cpu")
        self.model.to(self.device)
        self.head.to(self.device)
        self.batch_size = batch_size
        self._lock = threading.Lock()

    @torch.no_grad()
    def score(self, images, prompts, metadata):
        out = []
        with self._lock:
            for s in range(0, len(images), self.batch_size):
                emb = image_embeddings(self.model, self.image_processor, images[s:s + self.batch_size], self.device)
                out.append(self.head(emb).squeeze(-1).float().cpu())
        return torch.cat(out), torch.ones(len(images), dtype=torch.bool), {}
