"""Rollout engine: sample ``rollout_n`` images per prompt and keep what training needs to re-score them.

Each distinct prompt is encoded once (one VLM forward over the unique prompts of the rank); the optional CFG
branch is one extra batched encoding of the empty prompt and runs in the same DiT forward as the conditional one.
Stored per image: the T+1 trajectory latents (fp32, on CPU or the device) and the T per-step log-probs (fp32),
exactly what ``sde_step(prev_sample=...)`` needs to recompute the log-probs with gradients.

Shared ODE prefix: with ``init_same_noise``, the images of a group start from the same x_T with the same prompt, so
until the first stochastic step (an SDE window that starts late, Flow-GRPO-Fast) their deterministic ODE steps are
the same computation. ``share_ode_prefix`` runs those steps once per group (per micro-batch) and copies the result to
the group's other images: the images of a group are then bit-identical up to the window, and the DiT runs
``(prefix steps) x (groups)`` instead of ``(prefix steps) x (images)`` forwards there. Without sharing they agree to
floating-point rounding only (a batched forward's result can depend on the batch it runs in).

Reused last velocity (``reuse_last_velocity``): diffusers' shifted flow-matching schedule ends with a step from a
tiny σ_{T−1} to 0 (σ_{T−1} = 0.009 at 8 steps, shift 3), whose DiT forward barely moves the image. When that step is
an ODE step, it can take the velocity already computed at step T−2, x_0 = x_{T−1} − σ_{T−1}·v(x_{T−2}, σ_{T−2}),
which saves one DiT forward per image. No trained (stochastic) step changes; the final images differ from the full
ODE's by σ_{T−1}·(v_{T−2} − v_{T−1}).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
from PIL import Image
from tqdm.auto import tqdm

from deepgen_rl.rl.samplers import ODE, sde_step
from deepgen_rl.models.deepgen.model import guided_velocity
# decode_latents_chunked / latents_to_pil live in utils.images (evaluation uses them too); names kept importable here
from deepgen_rl.utils.images import VAE_DECODE_CHUNK, decode_latents_chunked, latents_to_pil  # noqa: F401
from deepgen_rl.utils.seeding import make_generator


def expand_groups(prompt_items, rollout_n: int) -> tuple[list[str], list[dict]]:
    """Per-image prompts and metadata, image k of prompt item i at index i·rollout_n + k (the rollout's order).

    An image's metadata is its prompt's ``metadata`` (the prompt file's fields, e.g. GenEval's ``include``; optional
    on the item) plus dataset, group_id, prompt_index and sample_index -- what every reward call receives.
    """
    prompts, metadata = [], []
    for it in prompt_items:
        extra = getattr(it, "metadata", None) or {}
        for k in range(rollout_n):
            prompts.append(it.prompt)
            metadata.append({**extra, "dataset": it.dataset, "group_id": it.group_id,
                             "prompt_index": it.prompt_index, "sample_index": k})
    return prompts, metadata


@dataclass
class RolloutBatch:
    """One rank's rollout. N images, T steps."""
    prompts: list[str]                 # (N) prompt of each image
    metadata: list[dict]               # (N) prompt-file fields + dataset, group_id, prompt_index, sample_index
    group_ids: torch.Tensor            # (N) int64, globally unique per prompt draw
    cond_index: torch.Tensor           # (N) row of `cond` holding the image's prompt conditioning
    cond: object                       # Conditioning of the unique prompts (U rows, on device)
    uncond: object | None              # Conditioning of the empty prompt (1 row) when CFG is used
    latents: torch.Tensor              # (N, T+1, C, h, w) fp32 trajectory x_T(noise) ... x_0
    log_probs: torch.Tensor            # (N, T) fp32 log-prob of each step at rollout time
    sigmas: torch.Tensor               # (T+1,) fp32 schedule 1 -> 0
    stochastic: torch.Tensor           # (T,) bool, steps that used the SDE
    images: list = field(default_factory=list)   # (N) PIL images decoded from x_0
    num_prompt_encodings: int = 0      # prompts run through the VLM for this batch (uncond included)

    def __len__(self) -> int:
        return len(self.prompts)


@torch.no_grad()
def rollout(model, prompt_items, *, rollout_n: int, micro_batch_size: int, sigmas: torch.Tensor,
            stochastic: torch.Tensor, sampler: str, eta: float, cfg_scale: float = 0.0, init_same_noise: bool = False,
            share_ode_prefix: bool = True, reuse_last_velocity: bool = False,
            height: int, width: int, seed: int, step: int, rank: int, transformer=None,
            storage_device: str | torch.device = "cpu",
            on_micro_batch: Callable[[list[int], list[Image.Image]], None] | None = None,
            progress: bool = False) -> RolloutBatch:
    """Generate ``rollout_n`` images for each of ``prompt_items`` (``PromptItem``-like: prompt, dataset, group_id).

    Noise: x_T of image k of group g comes from a generator seeded by (seed, step, g[, k]) — shared within a
    group when ``init_same_noise`` even if the group spans micro-batches, and distinct across ranks because group
    ids are globally unique. SDE noise of micro-batch m comes from (seed, step, rank, m).
    ``share_ode_prefix`` (only acts with ``init_same_noise``): the ODE steps before the first stochastic step run once
    per group of the micro-batch (see the module docstring).
    ``reuse_last_velocity``: the last step, if it is an ODE step (and T >= 2), reuses step T−2's velocity instead of
    running the DiT (see the module docstring).
    ``on_micro_batch(indices, images)`` is called as soon as a micro-batch is decoded (the trainer starts its
    reward requests there, so HTTP latency hides behind the next micro-batches).
    """
    device = next(model.transformer.parameters()).device
    dtype = next(model.transformer.parameters()).dtype
    num_steps = sigmas.numel() - 1
    unique_prompts: list[str] = []
    where: dict[str, int] = {}
    for it in prompt_items:
        if it.prompt not in where:
            where[it.prompt] = len(unique_prompts)
            unique_prompts.append(it.prompt)
    cond = model.encode_prompts(unique_prompts)
    uncond = model.encode_prompts([""]) if cfg_scale > 1.0 else None
    n_enc = len(unique_prompts) + (1 if uncond is not None else 0)

    prompts, metadata = expand_groups(prompt_items, rollout_n)
    group_ids = [md["group_id"] for md in metadata]
    cond_index = [where[p] for p in prompts]
    n = len(prompts)
    c, h, w = model.latent_shape(height, width)
    store = torch.device(device) if str(storage_device) == "device" else torch.device(storage_device)
    traj = torch.empty((n, num_steps + 1, c, h, w), dtype=torch.float32, device=store)
    log_probs = torch.zeros((n, num_steps), dtype=torch.float32, device=store)
    cond_index_t = torch.tensor(cond_index, dtype=torch.long)
    images: list = [None] * n

    sigma_list = [float(s) for s in sigmas.tolist()]  # host floats: no per-step device sync in sde_step
    stochastic_list = [bool(b) for b in stochastic.tolist()]
    # steps [0, prefix) are deterministic and shared by a group's images (same x_T, same prompt)
    prefix = (stochastic_list.index(True) if True in stochastic_list else num_steps) \
        if (init_same_noise and share_ode_prefix) else 0
    reuse_at = num_steps - 1 if (reuse_last_velocity and num_steps >= 2 and not stochastic_list[-1]) else None
    starts = range(0, n, micro_batch_size)
    bar = tqdm(total=len(starts) * num_steps, desc=f"rollout step {step}", disable=not progress, leave=False)
    for m, s in enumerate(starts):
        idx = list(range(s, min(s + micro_batch_size, n)))
        x = torch.stack([
            torch.randn((c, h, w), generator=make_generator(
                "init", seed, step, metadata[i]["group_id"], *(() if init_same_noise else (metadata[i]["sample_index"],))))
            for i in idx]).to(device=device, dtype=torch.float32)
        gen = make_generator("sde", seed, step, rank, m, device=device)
        mb_cond = cond.index_select(cond_index_t[idx].to(device))
        # the micro-batch's trajectory stays on the device and goes to storage in ONE copy (not 2 per step)
        mb_traj = torch.empty((len(idx), num_steps + 1, c, h, w), dtype=torch.float32, device=device)
        mb_log_probs = torch.zeros((len(idx), num_steps), dtype=torch.float32, device=device)
        mb_traj[:, 0] = x
        if prefix:  # the first row of each group in the micro-batch (expand_groups keeps a group's rows together)
            _, expand, counts = torch.unique_consecutive(
                torch.tensor([group_ids[i] for i in idx], device=device), return_inverse=True, return_counts=True)
            uniq = torch.cumsum(counts, 0) - counts
        for t in range(num_steps):
            if t == reuse_at:
                pass  # v is step T-2's velocity (see the module docstring)
            elif t < prefix and len(uniq) < len(idx):
                sig = torch.full((len(uniq),), sigma_list[t], device=device)
                v = guided_velocity(model, x.index_select(0, uniq).to(dtype), sig, mb_cond.index_select(uniq),
                                    uncond, cfg_scale, transformer).index_select(0, expand)
            else:
                sig = torch.full((len(idx),), sigma_list[t], device=device)
                v = guided_velocity(model, x.to(dtype), sig, mb_cond, uncond, cfg_scale, transformer)
            out = sde_step(sampler if stochastic_list[t] else ODE, v, x, sigma_list[t], sigma_list[t + 1],
                           eta, generator=gen)
            x = out.prev_sample
            mb_traj[:, t + 1] = x
            mb_log_probs[:, t] = out.log_prob
            bar.update(1)
        traj[idx[0]:idx[-1] + 1] = mb_traj.to(store)
        log_probs[idx[0]:idx[-1] + 1] = mb_log_probs.to(store)
        pil = latents_to_pil(decode_latents_chunked(model, x.to(dtype)))
        for i, im in zip(idx, pil):
            images[i] = im
        if on_micro_batch is not None:
            on_micro_batch(idx, pil)
    bar.close()
    return RolloutBatch(prompts=prompts, metadata=metadata, group_ids=torch.tensor(group_ids, dtype=torch.long),
                        cond_index=cond_index_t, cond=cond, uncond=uncond, latents=traj, log_probs=log_probs,
                        sigmas=sigmas.float().cpu(), stochastic=stochastic.cpu(), images=images,
                        num_prompt_encodings=n_enc)
