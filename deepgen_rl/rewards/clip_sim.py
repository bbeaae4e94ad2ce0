"""``clip_sim``: cosine similarity of CLIP text and image embeddings (transformers ``CLIPModel``).

Loads ``CLIPModel`` + ``AutoTokenizer`` + ``AutoImageProcessor`` with ``from_pretrained(model_name_or_path)``
(default ``$CLIP_MODEL_NAME_OR_PATH``). score = cos(text_embeds, image_embeds) in [-1, 1] (the projected
embeddings, no logit scale). Prompts longer than the text model's ``max_position_embeddings`` (77 for CLIP) are
truncated to that many tokens, keeping the end-of-text token last (CLIP pools its text embedding at that token), and
counted in ``info["num_truncated"]``.

Device (``device=`` or ``$CLIP_DEVICE``, default cpu): a bare ``"cuda"`` is resolved at construction to this rank's
GPU, ``cuda:$LOCAL_RANK`` (torchrun sets it; else the current device), or ``cuda:0`` when the process sees only one
GPU (``CUDA_VISIBLE_DEVICES`` set per rank), because ``score`` runs in reward worker threads whose current CUDA
device is ``cuda:0``. Inputs go to the device the model's weights are on. On the CPU under
torchrun (OMP_NUM_THREADS=1) CLIP runs on one thread: about 1 s per image for ViT-L/14, so use the GPU.
"""
from __future__ import annotations

import os
import threading

import torch

from deepgen_rl.utils.dist import local_cuda_index

from .base import Reward, WeightPath, register_reward

ENV_VAR = "CLIP_MODEL_NAME_OR_PATH"


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``device`` (or ``$CLIP_DEVICE``, default "cpu") with a bare "cuda" pinned to this rank's GPU.

    A bare "cuda" becomes ``cuda:0`` when exactly one GPU is visible (each process restricted to its own GPU by
    ``CUDA_VISIBLE_DEVICES``: there ``LOCAL_RANK`` is not an index), else ``cuda:$LOCAL_RANK``, else (no torchrun)
    the current CUDA device. An explicit index is kept. Raises ValueError naming CLIP_DEVICE when CUDA is asked for
    but absent, or the index is not a visible GPU.
    """
    dev = torch.device(device or os.environ.get("CLIP_DEVICE") or "cpu")
    if dev.type != "cuda":
        return dev
    if not torch.cuda.is_available():
        raise ValueError(f"clip_sim: device {str(dev)!r} (device= / CLIP_DEVICE) but CUDA is not available; "
                         "set CLIP_DEVICE=cpu")
    index = dev.index
    if index is None:
        torchrun = os.environ.get("LOCAL_RANK") not in (None, "")
        index = local_cuda_index() if torchrun or torch.cuda.device_count() == 1 else torch.cuda.current_device()
    if not 0 <= index < torch.cuda.device_count():
        raise ValueError(f"clip_sim: CUDA device {index} (device= / CLIP_DEVICE / LOCAL_RANK) does not exist; "
                         f"{torch.cuda.device_count()} GPU(s) visible")
    return torch.device("cuda", index)


def _features(output) -> torch.Tensor:
    # transformers 5 returns a ModelOutput whose pooler_output holds the projected features; 4.x a tensor.
    return output if isinstance(output, torch.Tensor) else output.pooler_output


@register_reward("clip_sim")
class ClipSimilarityReward(Reward):
    """Text-image cosine similarity in [-1, 1]."""

    name = "clip_sim"
    weight_paths = (WeightPath("model_name_or_path", (ENV_VAR,)),)

    def __init__(self, model_name_or_path: str | None = None, *, device: str | None = None, batch_size: int = 32,
                 dtype: torch.dtype = torch.float32):
        from transformers import AutoImageProcessor, AutoTokenizer, CLIPModel

        path = model_name_or_path or os.environ.get(ENV_VAR)
        if not path:
            raise ValueError(f"clip_sim: no CLIP model given; set {ENV_VAR} or pass model_name_or_path")
        try:
            self.model = CLIPModel.from_pretrained(path, dtype=dtype).eval().requires_grad_(False)
            self.tokenizer = AutoTokenizer.from_pretrained(path)
            self.image_processor = AutoImageProcessor.from_pretrained(path)
        except (OSError, ValueError) as exc:
            raise OSError(f"clip_sim: cannot load a CLIP model from {path!r} ({ENV_VAR}): {exc}") from exc
        self.model.to(resolve_device(device))
        self.device = next(self.model.parameters()).device  # where the inputs go, whatever thread scores
        self.batch_size = batch_size
        self.max_length = int(self.model.config.text_config.max_position_embeddings)
        self.eos_token_id = self.tokenizer.eos_token_id
        # One forward at a time: the fast tokenizer is not re-entrant and the model may share a GPU with rollout.
        self._lock = threading.Lock()

    def _tokenize(self, prompts: list[str]) -> tuple[dict, int]:
        lengths = [len(ids) for ids in self.tokenizer(prompts, truncation=False, verbose=False)["input_ids"]]
        batch = self.tokenizer(prompts, padding="max_length", truncation=True, max_length=self.max_length,
                               return_tensors="pt")
        num_truncated = sum(length > self.max_length for length in lengths)
        if num_truncated and self.eos_token_id is not None:
            # Guarantee the pooled (end-of-text) token survives truncation, whatever the tokenizer does.
            for row, length in enumerate(lengths):
                if length > self.max_length:
                    batch["input_ids"][row, -1] = self.eos_token_id
        return batch, num_truncated

    @torch.no_grad()
    def score(self, images, prompts, metadata):
        scores, num_truncated = [], 0
        with self._lock:
            for start in range(0, len(images), self.batch_size):
                chunk_prompts = prompts[start:start + self.batch_size]
                text, truncated = self._tokenize(chunk_prompts)
                num_truncated += truncated
                pixels = self.image_processor(
                    images=[img.convert("RGB") for img in images[start:start + self.batch_size]], return_tensors="pt"
                )["pixel_values"]
                text_emb = _features(self.model.get_text_features(
                    input_ids=text["input_ids"].to(self.device), attention_mask=text["attention_mask"].to(self.device)
                ))
                image_emb = _features(self.model.get_image_features(
                    pixel_values=pixels.to(self.device, self.model.dtype)))
                scores.append(torch.nn.functional.cosine_similarity(text_emb.float(), image_emb.float(), dim=-1).cpu())
        scores = torch.cat(scores).clamp(-1.0, 1.0)
        return scores, torch.ones(len(images), dtype=torch.bool), {"num_truncated": num_truncated}
