"""Pre-training the toy DeepGen (``deepgen_rl.toy.model`` builds, caches and pins; this module trains): the base
parts in the real folder layout, the VAE on the toy world's images, and the flow-matching pre-training of the DiT,
connector, projectors and think tokens. ``build_parts`` runs the three stages in one process, or in one rank of a
multi-process build (``deepgen_rl.toy.build_ranks``). The recipe is described in ``deepgen_rl.toy.model``'s
docstring and docs/toy_world.md."""

from __future__ import annotations

import os
import random
from typing import Any

import numpy as np
import torch

from deepgen_rl.models.tiny import train_bpe_tokenizer, write_random_qwen, write_vae_and_scheduler

from .model import toy_paths


def _train_tokenizer():
    """Byte-level BPE over the toy grammar's captions and the prompt template (whole words become tokens)."""
    from deepgen_rl.models.deepgen.model import PROMPT_TEMPLATE

    from .world import all_specs, caption

    corpus = [caption(s) for s in all_specs()] + [PROMPT_TEMPLATE.format(prompt="")] * 50
    return train_bpe_tokenizer(corpus, vocab_size=400)


def random_toy_dit(cfg: dict[str, Any]):
    """A randomly initialised DiT of build config ``cfg`` (torch's global RNG), as the build saves it: an
    ``SD3Transformer2DModel`` on the VAE's 16-channel latents (64 px / 2^(VAE blocks - 1) per side)."""
    from diffusers import SD3Transformer2DModel

    latent = 64 // 2 ** (len(cfg["vae"]["block_out_channels"]) - 1)
    return SD3Transformer2DModel(sample_size=latent, in_channels=16, out_channels=16,
                                 pos_embed_max_size=latent // cfg["dit"]["patch_size"], qk_norm="rms_norm",
                                 **cfg["dit"])


def _write_base_parts(paths: dict[str, str], cfg: dict[str, Any]) -> None:
    """Random VLM + tokenizer, DiT, VAE and scheduler in the real folder layout (as `models.tiny`)."""
    seed = cfg["seed"]
    write_random_qwen(paths["qwen"], _train_tokenizer(), cfg["text"], cfg["vision"], vocab_size=512,
                      max_position_embeddings=512, rope_theta=1e4, seed=seed)
    torch.manual_seed(seed + 1)
    random_toy_dit(cfg).save_pretrained(os.path.join(paths["sd3"], "transformer"))
    torch.manual_seed(seed + 2)
    write_vae_and_scheduler(paths["sd3"], cfg["vae"], scaling_factor=1.0, shift_factor=0.0)


def _pixels(images) -> torch.Tensor:
    from .world import images_to_array

    return torch.from_numpy(images_to_array(images)).permute(0, 3, 1, 2).float() / 255.0


def _bar(total: int, desc: str, progress: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="step", disable=not progress, mininterval=2.0)


def _lr_lambda(steps: int, warmup: int, floor: float):
    """Linear warm-up over ``warmup`` steps, then linear decay from 1 to ``floor`` at the last step."""
    return lambda s: min(1.0, (s + 1) / warmup) * (floor + (1.0 - floor) * (1.0 - s / steps))


VAE_RECIPES = ("stochastic", "mean")


def object_sizes(cfg: dict[str, Any]) -> tuple[float, float]:
    """The object size range the build renders its images with: ``cfg["object_size"]``, else the world's."""
    from .world import IMAGE_SIZE, SIZE_RANGE

    if not cfg.get("object_size"):
        return SIZE_RANGE
    lo, hi = (float(v) for v in cfg["object_size"])
    if not 0 < lo <= hi <= IMAGE_SIZE / 2:
        raise ValueError(f"toy config: object_size {cfg['object_size']!r} must be (lo, hi) with "
                         f"0 < lo <= hi <= {IMAGE_SIZE // 2}")
    return lo, hi


def layout_kwargs(cfg: dict[str, Any]) -> dict[str, Any]:
    """How the build places objects in its images (``world.sample_pairs`` keywords): ``cfg["layout"]`` "random"
    (the world's placement, the default) or "slots" (``world.slot_layout``, centres moved ≤ ``layout_jitter`` px),
    with objects of ``object_sizes(cfg)``."""
    from .world import LAYOUTS

    mode = cfg.get("layout", "random")
    if mode not in LAYOUTS:
        raise ValueError(f"toy config: layout {mode!r} is not one of {LAYOUTS}")
    return dict(sizes=object_sizes(cfg), layout_mode=mode, jitter=float(cfg.get("layout_jitter", 2.0)))


def _train_vae(vae_dir: str, cfg: dict[str, Any], progress: bool) -> dict[str, float]:
    """Train the VAE in place (then set scaling_factor = 1/std, shift_factor = mean of its latents).

    ``cfg["vae_recipe"]``:
    - ``"stochastic"`` (toy-v2, the default): fresh train-split images every step, z sampled from the posterior,
      MSE + 1e-6·KL, constant learning rate; the latent statistics come from 64 further train images.
    - ``"mean"``: an autoencoder of the posterior means on a fixed pool of ``vae_pool`` train images. The DiT is
      trained on (and generates) the means, so the decoder learns to decode z = mean + n·ξ with a small fixed n
      (``vae_latent_noise``) instead of the posterior's own std, which starts at 1 and, with a negligible KL weight,
      only slows the start; MSE, warm-up then linear decay; latent statistics over the pool.
    Both return ``vae_recon_strict``: the checker's strict accuracy on reconstructions of 128 held-out images (the
    ceiling of what the toy model can be scored at).
    """
    from diffusers import AutoencoderKL

    from deepgen_rl.utils.dist import barrier

    from .build_ranks import average_grads, is_writer, shard
    from .world import sample_pairs

    recipe = cfg.get("vae_recipe", "stochastic")
    lay = layout_kwargs(cfg)
    if recipe not in VAE_RECIPES:
        raise ValueError(f"toy config: vae_recipe {recipe!r} is not one of {VAE_RECIPES}")
    vae = AutoencoderKL.from_pretrained(vae_dir)
    vae.train()
    rng = random.Random(f"toy-vae|{cfg['seed']}")
    pool = None
    if recipe == "mean":
        pool = _pixels([im for _, im in sample_pairs("train", cfg["vae_pool"], rng, **lay)]) * 2 - 1
    opt = torch.optim.Adam(vae.parameters(), lr=cfg["vae_lr"])
    sched = (torch.optim.lr_scheduler.LambdaLR(opt, _lr_lambda(cfg["vae_steps"], 20, 0.1)) if recipe == "mean"
             else None)
    gen = torch.Generator().manual_seed(cfg["seed"] + 10)
    bar = _bar(cfg["vae_steps"], "toy VAE", progress)
    loss_v = float("nan")
    params = list(vae.parameters())
    for step in range(cfg["vae_steps"]):
        # Full-batch draws, then this rank's slice (build_ranks.shard: the whole batch in a one-process build).
        if recipe == "mean":
            x = shard(pool[torch.randint(0, len(pool), (cfg["vae_batch"],), generator=gen)])
            mean = vae.encode(x).latent_dist.mean
            noise = shard(torch.randn((cfg["vae_batch"], *mean.shape[1:]), generator=gen))
            recon = vae.decode(mean + cfg["vae_latent_noise"] * noise).sample
            loss = torch.nn.functional.mse_loss(recon, x)
        else:
            x = shard(_pixels([im for _, im in sample_pairs("train", cfg["vae_batch"], rng, **lay)]) * 2 - 1)
            post = vae.encode(x).latent_dist
            noise = shard(torch.randn((cfg["vae_batch"], *post.mean.shape[1:]), generator=gen))
            recon = vae.decode(post.mean + post.std * noise).sample
            loss = torch.nn.functional.mse_loss(recon, x) + 1e-6 * post.kl().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        loss_v = average_grads(params, loss)
        opt.step()
        if sched is not None:
            sched.step()
        bar.update(1)
        if step % 20 == 0:
            bar.set_postfix(loss=f"{loss_v:.4f}", refresh=False)
    bar.close()
    if not is_writer():  # the writer computes the latent statistics, checks and saves the VAE; the other ranks
        barrier()        # load it from there (the DiT stage), so they only wait for it
        return {}
    vae.eval()
    with torch.no_grad():
        if recipe == "mean":
            z = torch.cat([vae.encode(pool[i:i + 256]).latent_dist.mean for i in range(0, len(pool), 256)])
            recon_mse = float("nan")
        else:
            x = _pixels([im for _, im in sample_pairs("train", 64, rng, **lay)]) * 2 - 1
            z = vae.encode(x).latent_dist.mean
            recon_mse = torch.nn.functional.mse_loss(vae.decode(z).sample.clamp(-1, 1), x).item()
        shift, scale = float(z.mean()), float(1.0 / z.std())
        held = sample_pairs("held_out", 128, random.Random(f"toy-vae-check|{cfg['seed']}"), **lay)
        xh = _pixels([im for _, im in held]) * 2 - 1
        recon = vae.decode(vae.encode(xh).latent_dist.mean).sample.clamp(-1, 1)
        if recipe == "mean":
            recon_mse = torch.nn.functional.mse_loss(recon, xh).item()
    vae.register_to_config(shift_factor=shift, scaling_factor=scale)
    vae.save_pretrained(vae_dir)
    barrier()
    return {"vae_final_loss": loss_v, "vae_recon_mse": recon_mse, "vae_shift": shift, "vae_scale": scale,
            "vae_recon_strict": _strict_accuracy((recon + 1) / 2, [c for c, _ in held])}


def _strict_accuracy(images: torch.Tensor, captions: list[str]) -> float:
    """The checker's strict accuracy of images (B, 3, 64, 64) in [0, 1] against their captions."""
    from deepgen_rl.utils.images import latents_to_pil

    from .evaluate import check_images, summarize

    return summarize([v.to_dict() for v in check_images(latents_to_pil(images), captions)])["strict_acc"]


def _pretrain_deepgen(paths: dict[str, str], cfg: dict[str, Any], progress: bool) -> dict[str, float]:
    """Flow-matching pre-training of DiT + connector + projectors + think tokens; writes the SFT checkpoint."""
    from deepgen_rl.models.build import build_from_config
    from deepgen_rl.checkpoints.sft import export_sft_state_dict
    from deepgen_rl.models.deepgen.model import DeepGen
    from deepgen_rl.rl.losses import sft_flow_matching_loss
    from deepgen_rl.sft.loss import drop_captions, sample_sigmas

    from .build_ranks import average_grads, is_writer, shard
    from .world import sample_pairs

    seed = cfg["seed"]
    lay = layout_kwargs(cfg)
    model = build_from_config(dict(cfg["deepgen"], lmm_path=paths["qwen"], sd3_path=paths["sd3"], dtype="float32",
                                   init_seed=seed + 3))
    gen = torch.Generator().manual_seed(seed + 4)
    with torch.no_grad():
        for proj in (model.projector_2, model.projector_3):
            proj.weight.copy_(torch.randn(proj.weight.shape, generator=gen) / proj.weight.shape[1] ** 0.5)
        for name, param in model.lmm.named_parameters():
            if ".lora_" in name:
                param.copy_(0.05 * torch.randn(param.shape, generator=gen))
    model.lmm.requires_grad_(False)
    model.vae.requires_grad_(False)
    model.lmm.eval()
    model.vae.eval()
    trained = (list(model.transformer.parameters()) + list(model.connector.parameters())
               + list(model.projector_1.parameters()) + list(model.projector_2.parameters())
               + list(model.projector_3.parameters()) + [model.meta_queries])
    if cfg.get("train_lora"):
        trained += [p for n, p in model.lmm.named_parameters() if ".lora_" in n]
    for p in trained:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(trained, lr=cfg["dit_lr"], weight_decay=0.0)
    steps = cfg["dit_steps"]
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _lr_lambda(steps, 100, 0.1))
    rng = random.Random(f"toy-dit|{seed}")
    noise_gen = torch.Generator().manual_seed(seed + 5)
    # encode_prompts is no_grad for RL (the conditioning is frozen there); pre-training trains it, so call the
    # undecorated function.
    encode_with_grad = DeepGen.encode_prompts.__wrapped__
    pool_n = int(cfg.get("dit_pool", 0))
    if pool_n:  # render and encode a fixed pool once instead of fresh pairs every step (~35% of a step's CPU)
        pool_texts, pool_images = zip(*sample_pairs("train", pool_n, rng, **lay))
        with torch.no_grad():
            pool_x0 = torch.cat([model.encode_images(_pixels(pool_images[i:i + 256]))
                                 for i in range(0, pool_n, 256)])
    ema_decay = float(cfg.get("dit_ema", 0.0))  # > 0: the checkpoint holds an EMA of the trained weights
    ema = [p.detach().clone() for p in trained] if ema_decay else None
    bar = _bar(steps, "toy DiT + connector", progress)
    losses: list[float] = []
    for step in range(steps):
        if pool_n:
            idx = torch.randint(0, pool_n, (cfg["dit_batch"],), generator=noise_gen)
            texts, x0 = [pool_texts[i] for i in idx.tolist()], pool_x0[idx]
        else:
            texts, images = zip(*sample_pairs("train", cfg["dit_batch"], rng, **lay))
            with torch.no_grad():
                x0 = model.encode_images(_pixels(images))
        texts, _ = drop_captions(list(texts), cfg["caption_dropout"], noise_gen)
        sigma = sample_sigmas(x0.shape[0], model.scheduler_shift, noise_gen)
        noise = torch.randn(x0.shape, generator=noise_gen)
        # Full-batch draws above, this rank's slice below (the whole batch in a one-process build).
        texts, x0, sigma, noise = shard(texts), shard(x0), shard(sigma), shard(noise)
        cond = encode_with_grad(model, texts)
        s = sigma.view(-1, 1, 1, 1)
        v = model.predict_velocity((1 - s) * x0 + s * noise, sigma, cond)
        loss = sft_flow_matching_loss(v, noise, x0)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        loss_v = average_grads(trained, loss)
        torch.nn.utils.clip_grad_norm_(trained, 1.0)
        opt.step()
        sched.step()
        if ema is not None:
            with torch.no_grad():
                torch._foreach_lerp_(ema, [p.detach() for p in trained], 1.0 - ema_decay)
        losses.append(loss_v)
        bar.update(1)
        if step % 20 == 0:
            bar.set_postfix(loss=f"{np.mean(losses[-50:]):.4f}", refresh=False)
    bar.close()
    if ema is not None:
        with torch.no_grad():
            for p, e in zip(trained, ema):
                p.copy_(e)
    if is_writer():
        torch.save(export_sft_state_dict(model, legacy=True), paths["checkpoint"])
    return {"dit_first_loss": float(np.mean(losses[:50])), "dit_final_loss": float(np.mean(losses[-100:]))}


def build_parts(out_dir: str, cfg: dict[str, Any], progress: bool) -> dict[str, float]:
    """The build's three stages in this process (one rank of a multi-process build: ``build_ranks``): base parts,
    VAE, pre-training. The writer (rank 0) writes the files; returns the statistics for ``toy_meta.json``."""
    from deepgen_rl.utils.dist import barrier

    from .build_ranks import is_writer

    paths = toy_paths(out_dir)
    with torch.random.fork_rng(devices=[]):
        if is_writer():
            _write_base_parts(paths, cfg)
        barrier()
        stats = _train_vae(os.path.join(paths["sd3"], "vae"), cfg, progress)
        stats.update(_pretrain_deepgen(paths, cfg, progress))
    return stats


