"""SFT-auxiliary flow-matching loss on real image–caption pairs and the trainer-facing helper
(docs/training.md#sft-auxiliary-loss).

The trainer combines it with the policy loss in the same optimizer update::

    total = (1 − λ)·L_grpo + λ·L_sft          # λ = --sftaux_coef; λ = 0 builds no SFTAuxiliary at all
"""

from __future__ import annotations

import os

import torch

from deepgen_rl.rl.losses import sft_flow_matching_loss
from deepgen_rl.sft.data import SFTLoader, build_sft_loader
from deepgen_rl.utils.seeding import derive_seed


def sample_sigmas(batch_size: int, shift: float, generator: torch.Generator) -> torch.Tensor:
    """σ ∈ [0, 1), FloatTensor[B] fp32 on CPU: u ~ U[0, 1), σ = shift·u / (1 + (shift − 1)·u).

    This is the continuous form of picking a training step uniformly from ``FlowMatchEulerDiscreteScheduler``'s
    shifted sigma grid (its sigmas are exactly this map applied to a uniform grid), i.e. SD3's "uniform timestep,
    shifted" training distribution; shift = 3 puts more weight on high noise (σ > 0.5 with probability 3/4).
    """
    u = torch.rand(batch_size, generator=generator, dtype=torch.float32)
    return shift * u / (1.0 + (shift - 1.0) * u)


def drop_captions(texts: list[str], p: float, generator: torch.Generator) -> tuple[list[str], torch.Tensor]:
    """Replace each caption by ``""`` with probability ``p`` (one draw per caption); returns (texts, dropped mask)."""
    dropped = torch.rand(len(texts), generator=generator) < p
    return ["" if d else t for t, d in zip(texts, dropped.tolist())], dropped


def sft_aux_loss(model, batch: dict, *, transformer=None, generator: torch.Generator,
                 caption_dropout: float = 0.1, latents: torch.Tensor | None = None
                 ) -> tuple[torch.Tensor, dict[str, float]]:
    """Flow-matching MSE on a batch of real pairs; returns (scalar fp32 loss with grad into the DiT, stats).

    ``batch = {"pixel_values": FloatTensor[B, 3, S, S] in [0, 1], "texts": list[str]}``. With x₀ = VAE latents
    (no grad), ε ~ N(0, I), σ ~ :func:`sample_sigmas` (shift = ``model.scheduler_shift``):
    x_σ = (1 − σ)·x₀ + σ·ε, v_θ = model.predict_velocity(x_σ, σ, cond, transformer=transformer) and
    loss = mean over B, C, H, W of (v_θ − (ε − x₀))² in fp32. Captions are replaced by ``""`` with probability
    ``caption_dropout`` before encoding; the frozen prompt encoder runs without grad. All randomness (dropout, σ, ε)
    comes from ``generator`` (a CPU generator), so a fixed generator state gives a fixed loss. ``latents``: x₀
    already encoded (``model.encode_images`` of the batch's images: the posterior mean, so the same x₀ whenever an
    image is encoded), then the VAE does not run.
    """
    texts, dropped = drop_captions(list(batch["texts"]), caption_dropout, generator)
    with torch.no_grad():
        x0 = model.encode_images(batch["pixel_values"]) if latents is None else latents
        cond = model.encode_prompts(texts)
    sigma = sample_sigmas(x0.shape[0], float(model.scheduler_shift), generator)
    noise = torch.randn(x0.shape, generator=generator, dtype=torch.float32)
    sigma, noise = sigma.to(x0.device), noise.to(device=x0.device, dtype=x0.dtype)
    s = sigma.to(x0.dtype).view(-1, *([1] * (x0.dim() - 1)))
    x_sigma = (1.0 - s) * x0 + s * noise
    v_pred = model.predict_velocity(x_sigma, sigma, cond, transformer=transformer)
    loss = sft_flow_matching_loss(v_pred, noise, x0)
    stats = {"sftaux/loss": loss.item(), "sftaux/sigma_mean": sigma.float().mean().item(),
             "sftaux/caption_dropped": dropped.float().mean().item(), "sftaux/batch_size": float(x0.shape[0])}
    return loss, stats


class SFTAuxiliary:
    """The trainer's SFT-auxiliary source: owns the rank's loader and RNG; ``loss()`` draws the next batch.

    ``SFTAuxiliary(config_path, model, rank=r, world_size=W, seed=s, micro_batch_size=b)``;
    ``loss(transformer=None) -> (loss, stats)`` (pass the DeepSpeed-wrapped DiT as ``transformer``);
    ``state_dict()/load_state_dict()`` cover the data position and the noise generator, so a resumed run draws the
    same batches, σ, ε and caption drops.

    Latent cache: the VAE is frozen and x₀ is its posterior mean, so an image's latents never change. Up to
    ``latent_cache_mb`` MiB of them (fp32, in host memory) are kept by image key and reused when the
    loader draws the image again; only the batch's other images go through the VAE (one batched encode). Beyond
    the cap, new images are encoded every time (nothing is evicted). 0 turns the cache off. A cached x₀ equals a
    fresh one up to float rounding (an encode's result can depend on the batch it runs in).
    """

    def __init__(self, config_path: str | os.PathLike, model, *, rank: int, world_size: int, seed: int,
                 micro_batch_size: int | None = None, caption_dropout: float = 0.1,
                 image_size: int | None = None, num_workers: int | None = None, latent_cache_mb: float = 0.0):
        if not 0.0 <= caption_dropout <= 1.0:
            raise ValueError(f"caption_dropout must be in [0, 1], got {caption_dropout}")
        if latent_cache_mb < 0:
            raise ValueError(f"latent_cache_mb must be >= 0, got {latent_cache_mb}")
        self.model, self.caption_dropout = model, caption_dropout
        self.latent_cache_bytes = int(latent_cache_mb * 2**20)
        self._latents: dict[tuple[int, int], torch.Tensor] = {}
        self._cached_bytes = 0
        self.cache_hits = self.cache_misses = 0
        self.loader: SFTLoader = build_sft_loader(config_path, rank=rank, world_size=world_size, seed=seed,
                                                  batch_size=micro_batch_size, image_size=image_size,
                                                  num_workers=num_workers)
        self.generator = torch.Generator().manual_seed(derive_seed("sftaux-noise", seed, rank))
        self._iterator = None

    def next_batch(self) -> dict:
        if self._iterator is None:
            self._iterator = iter(self.loader)
        return next(self._iterator)

    def _device_batch(self, batch: dict) -> dict:
        try:
            param = next(self.model.transformer.parameters())
        except (AttributeError, StopIteration):
            return batch
        return {**batch, "pixel_values": batch["pixel_values"].to(param.device)}

    def _cached_latents(self, batch: dict) -> torch.Tensor | None:
        """x₀ of the batch from the cache, encoding (and caching, under the cap) the images it lacks."""
        keys = batch.get("keys")
        if not self.latent_cache_bytes or keys is None:
            return None
        keys = [tuple(k) for k in keys]
        missing = [i for i, k in enumerate(keys) if k not in self._latents]
        self.cache_hits += len(keys) - len(missing)
        self.cache_misses += len(missing)
        fresh = {}
        if missing:
            with torch.no_grad():
                enc = self.model.encode_images(batch["pixel_values"][missing])
            for j, i in enumerate(missing):
                fresh[keys[i]] = enc[j]
                nbytes = enc[j].numel() * enc[j].element_size()
                if keys[i] not in self._latents and self._cached_bytes + nbytes <= self.latent_cache_bytes:
                    self._latents[keys[i]] = enc[j].to("cpu", copy=True)
                    self._cached_bytes += nbytes
        device = batch["pixel_values"].device
        return torch.stack([fresh[k] if k in fresh else self._latents[k].to(device) for k in keys])

    def loss(self, transformer=None) -> tuple[torch.Tensor, dict[str, float]]:
        batch = self._device_batch(self.next_batch())
        return sft_aux_loss(self.model, batch, transformer=transformer, generator=self.generator,
                            caption_dropout=self.caption_dropout, latents=self._cached_latents(batch))

    def state_dict(self) -> dict:
        return {"loader": self.loader.state_dict(), "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.loader.load_state_dict(state["loader"])
        self.generator.set_state(state["generator"])
        self._iterator = None  # the next loss() restarts the stream from the loaded position
