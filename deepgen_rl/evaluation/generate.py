"""Eval image generation: deterministic seeds, batched classifier-free guidance, rank sharding.

Work items are the ``(prompt, duplicate)`` pairs of a dataset in file order (duplicate fastest); item ``i`` goes to
rank ``i % world_size``. Each item's initial noise (and, for ``inference_mode="sde"``, every step's noise) comes from
its own ``torch.Generator`` seeded with :func:`item_seed` ``(seed, dataset, index, dup)``, so an image does not
depend on the batch size, world size or rank that produced it, and the same seed gives the same images at every eval
step (comparable across training).

Guidance: with ``cfg_scale > 1`` the conditional and unconditional (empty prompt) inputs go through ONE forward of
doubled batch, ``v = v_u + s·(v_c − v_u)``; with ``cfg_scale <= 1`` only the conditional branch runs.
Images are written to ``out_dir/<dataset>/<index>.<dup>.png``.

ZeRO-3: every DiT forward of a partitioned DiT all-gathers its parameters, a collective every rank must join. When
the shards are uneven (e.g. 3 items on 2 ranks) a rank with fewer batches runs padding batches (one empty-prompt
item, discarded) until it has run as many batches, hence as many DiT forwards, as rank 0.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from deepgen_rl.evaluation.config import EvalDatasetSpec, EvalPrompt
from deepgen_rl.models.deepgen.model import guided_velocity
from deepgen_rl.rl.samplers import DEFAULT_SDE_ETA, DEFAULT_SDE_SAMPLER, ODE
from deepgen_rl.utils.images import decode_latents_chunked, latents_to_pil
from deepgen_rl.utils.seeding import derive_seed


@dataclass
class EvalImageRecord:
    dataset: str
    index: int
    dup: int
    prompt: str
    rel_path: str  # "<dataset>/<index>.<dup>.png", relative to the eval step directory
    seed: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def image_filename(index: int, dup: int) -> str:
    return f"{index}.{dup}.png"


def item_seed(seed: int, dataset: str, index: int, dup: int) -> int:
    """Stable 63-bit seed for one eval image (the project's one seed derivation, independent of PYTHONHASHSEED)."""
    return derive_seed("eval", seed, dataset, index, dup)


def shard_items(spec: EvalDatasetSpec, rank: int, world_size: int) -> list[tuple[EvalPrompt, int]]:
    """The ``(prompt, dup)`` pairs of ``rank``: global item ``i`` goes to rank ``i % world_size``."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} out of range for world_size {world_size}")
    items = [(p, d) for p in spec.prompts for d in range(spec.duplicates)]
    return items[rank::world_size]


def num_batches(num_items: int, world_size: int, batch_size: int) -> int:
    """Batches of the largest shard (rank 0's): ceil(ceil(num_items / world_size) / batch_size)."""
    return -(-(-(-num_items // world_size)) // batch_size)


def is_zero3_partitioned(module) -> bool:
    """True when ``module`` holds DeepSpeed ZeRO-3 parameters (each forward then gathers them collectively)."""
    params = getattr(module, "parameters", None)
    return callable(params) and any(hasattr(p, "ds_id") for p in params())


def _model_device(model) -> torch.device:
    device = getattr(model, "device", None)
    if isinstance(device, torch.device):
        return device
    try:
        return next(model.parameters()).device
    except (AttributeError, StopIteration):
        return torch.device("cpu")


def _per_item_normal(shape, generators: list[torch.Generator], device) -> torch.Tensor:
    """One N(0, I) draw of ``shape`` per generator (CPU, fp32) stacked on dim 0 and moved to ``device``."""
    return torch.stack([torch.randn(shape, generator=g, dtype=torch.float32) for g in generators]).to(device)


def _expand_like(t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    t = torch.as_tensor(t, device=x.device, dtype=x.dtype)
    return t.view(-1, *([1] * (x.dim() - 1))) if t.dim() == 1 else t


@torch.no_grad()
def sample_latents(model, cond, noise: torch.Tensor, *, cfg_scale: float, num_inference_steps: int,
                   inference_mode: str = "ode", sampler: str = DEFAULT_SDE_SAMPLER, eta: float = DEFAULT_SDE_ETA,
                   generators: list[torch.Generator] | None = None, uncond=None, transformer=None) -> torch.Tensor:
    """Integrate from σ=1 (``noise``, (B,16,h,w) fp32) to σ=0 and return clean latents.

    ``inference_mode="ode"`` uses the ``"ode"`` (Euler) step of :func:`deepgen_rl.rl.samplers.sde_step`;
    ``"sde"`` uses ``sampler`` with ``eta`` and draws each item's step noise from its own generator:
    ``x' = mean + std·ξ_item``. ``uncond`` is the empty-prompt conditioning (batch 1) for ``cfg_scale > 1``.
    """
    from deepgen_rl.rl.samplers import make_sigmas, sde_step

    if inference_mode not in ("ode", "sde"):
        raise ValueError(f"inference_mode must be 'ode' or 'sde', got {inference_mode!r}")
    batch = noise.shape[0]
    if cfg_scale > 1.0 and uncond is None:
        raise ValueError("cfg_scale > 1 needs the unconditional conditioning")
    sigmas = make_sigmas(num_inference_steps, model.scheduler_shift).to(noise.device, torch.float32)
    step_name = ODE if inference_mode == "ode" else sampler
    # the sampler's own sample is replaced by per-item noise below; this generator keeps the global RNG untouched
    scratch = torch.Generator(device=noise.device).manual_seed(0)
    x = noise
    for j in range(num_inference_steps):
        sigma, sigma_next = sigmas[j], sigmas[j + 1]
        # the same CFG implementation as rollout and training: both branches in one batched forward
        v = guided_velocity(model, x, sigma.expand(batch), cond, uncond, cfg_scale, transformer).float()
        out = sde_step(step_name, v, x, sigma, sigma_next, eta, generator=scratch)
        if inference_mode == "sde" and float(sigma_next) > 0:
            xi = _per_item_normal(x.shape[1:], generators, x.device)
            x = out.mean + _expand_like(out.std, x) * xi
        else:
            x = out.prev_sample if inference_mode == "ode" else out.mean
        x = x.float()
    return x


def generate_eval_images(model, spec: EvalDatasetSpec, out_dir: str | Path, *, rank: int = 0, world_size: int = 1,
                         height: int = 512, width: int = 512, inference_mode: str = "ode", eta: float = DEFAULT_SDE_ETA,
                         sampler: str = DEFAULT_SDE_SAMPLER, seed: int = 42, transformer=None, batch_size: int = 8,
                         progress: bool = True, pad_batches: bool | None = None) -> list[EvalImageRecord]:
    """Generate this rank's shard of ``spec`` into ``out_dir/<dataset>/<index>.<dup>.png``.

    ``model`` provides ``encode_prompts``, ``predict_velocity``, ``decode_latents``, ``latent_shape`` and
    ``scheduler_shift`` (see docs/architecture.md); ``transformer`` (e.g. EMA weights) is passed through to
    ``predict_velocity``. Returns one record per image written by this rank, in shard order.
    """
    items = shard_items(spec, rank, world_size)
    ds_dir = Path(out_dir) / spec.name
    ds_dir.mkdir(parents=True, exist_ok=True)
    device = _model_device(model)
    latent_shape = tuple(model.latent_shape(height, width))
    uncond = model.encode_prompts([""]) if spec.cfg_scale > 1.0 else None
    records: list[EvalImageRecord] = []
    batches = [items[i:i + batch_size] for i in range(0, len(items), batch_size)]
    bar = tqdm(batches, desc=f"eval {spec.name}", unit="batch", disable=not progress or rank != 0)
    for chunk in bar:
        seeds = [item_seed(seed, spec.name, p.index, d) for p, d in chunk]
        generators = [torch.Generator().manual_seed(s) for s in seeds]
        noise = _per_item_normal(latent_shape, generators, device)
        cond = model.encode_prompts([p.prompt for p, _ in chunk])
        latents = sample_latents(model, cond, noise, cfg_scale=spec.cfg_scale,
                                 num_inference_steps=spec.num_inference_steps, inference_mode=inference_mode,
                                 sampler=sampler, eta=eta, generators=generators, uncond=uncond,
                                 transformer=transformer)
        with torch.no_grad():
            images = decode_latents_chunked(model, latents)
        for (p, d), s, img in zip(chunk, seeds, latents_to_pil(images)):
            rel = f"{spec.name}/{image_filename(p.index, d)}"
            img.save(Path(out_dir) / rel)
            records.append(EvalImageRecord(spec.name, p.index, d, p.prompt, rel, s))
    if pad_batches is None:
        pad_batches = is_zero3_partitioned(transformer if transformer is not None else getattr(model, "transformer",
                                                                                                 None))
    if pad_batches:
        for _ in range(num_batches(len(spec.prompts) * spec.duplicates, world_size, batch_size) - len(batches)):
            sample_latents(model, model.encode_prompts([""]), torch.zeros((1, *latent_shape), device=device),
                           cfg_scale=spec.cfg_scale, num_inference_steps=spec.num_inference_steps,
                           inference_mode="ode", uncond=uncond, transformer=transformer)
    return records
