"""Full-size DeepGen DiT throughput: rollout images/s, training-step time and achieved TFLOP/s vs an analytic count.

    python bench/gpu_throughput.py [--config full|tiny] [--batch 32] [--train-batch 32] [--image-size 512]
                                   (tiny defaults: --batch 4 --train-batch 4 --image-size 128)
                                   [--num-inference-steps 50] [--iters 10] [--warmup 3]
                                   [--gradient-checkpointing on|off] [--peak_tflops 989] [--dtype bf16]
                                   [--master-weights fp32|compute] [--no-vae] [--check-flops] [--flops-only]
                                   [--deepspeed zero2|none] [--sft-batch 4] [--allow-cpu] [--smoke]

``--config full`` builds, with random weights and no download, the SD3.5-Medium DiT of DeepGen
(``SD3Transformer2DModel``: 24 layers, 24 heads x 64 = 1536, joint_attention_dim 4096, caption_projection_dim 1536,
pooled 2048, patch 2, 16 channels, pos_embed_max_size 384, dual attention in layers 0-12, qk_norm rms_norm), the SD3
VAE (decoder) and the Stacked-Channel-Bridging connector (2048 wide, 6 layers, 32 heads, MLP 11946) with its
projectors. The Qwen2.5-VL-3B VLM is NOT run: its fused hidden states are random tensors of the right shape
(U, 256 + 128 tokens, 6 x 2048), so the conditioning the DiT sees has the real shape (B, 384, 4096) + (B, 2048).
Measured, with ``torch.cuda.synchronize`` around each timed call, medians over ``--iters`` after ``--warmup``:

  rollout step   one DiT forward (batch ``--batch``, no grad) + ``sde_step(DEFAULT_SDE_SAMPLER)``, as in ``rollout()``
  decode         VAE decode of ``--batch`` latents
  rollout img/s  batch / (T x rollout step + decode)   (T = ``--num-inference-steps``; encoding is once per prompt)
  train piece    what the trainer runs per trained (micro-batch, timestep): one DiT forward through the DeepSpeed
                 engine + the frozen bf16 reference DiT's forward (KL, β > 0) + ``sde_step(prev_sample=...)`` +
                 ``engine.backward`` (ZeRO-2 reduces the gradient buckets in every backward: the per-piece
                 gradient reduction is inside this time) at batch ``--train-batch``
  SFT term       one DiT forward + backward of the SFT-auxiliary flow-matching loss (batch ``--sft-batch``)
  step           the boundary backward + ``engine.step()`` (AdamW on ZeRO-2's fp32 partition) minus a train piece
  connector      projector_1 + connector + projector_2/3 for ``--batch`` prompts (the VLM excluded)

Default path = train.sh's on GPUs: ``--deepspeed zero2`` wraps the trained DiT in a DeepSpeed engine built from
``scripts/deepspeed/zero2.json`` (bf16 module, fp32 masters and Adam states partitioned over the ranks; run it under
torchrun with one process per GPU to include the cross-GPU reduction, or alone for one GPU); ``--deepspeed none``
is the plain path (fp32 master weights + bf16 autocast). Memory: the peak ``torch.cuda.max_memory_allocated`` of the
rank with everything a recipe rank holds: the DiT (engine), the reference DiT, the connector, the VAE and a
placeholder of the VLM's bf16 weights (2 B × 3.75 B; the VLM itself is not run). Without CUDA the script stops
with one line unless ``--allow-cpu`` (or ``--smoke`` / ``--flops-only``).

TFLOP/s use the analytic matmul FLOPs of one DiT forward (``dit_forward_flops``; formula in its docstring);
a training piece counts 3x a forward (forward + backward of activations and weights; activation checkpointing
recomputes one more forward, which is not counted: model FLOPs utilisation). ``--check-flops`` compares the formula
with ``torch.utils.flop_counter.FlopCounterMode`` on a meta-device copy of the chosen config (exact: 1.000x on both
the tiny and the full config; the tests check both).
Peak: ``--peak_tflops``, else 989 TFLOP/s dense bf16 for an H100/H200, else none (no roofline column).
On CPU use ``--config tiny`` (or ``--smoke``): fp32, a 2-layer DiT, seconds.
"""
from __future__ import annotations

import argparse
import sys
import time
from contextlib import nullcontext
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import load_note, median, print_ratio, print_rerun, print_table, setup_env  # noqa: E402

# SD3.5-Medium DiT (UniPic2-SD3.5M-Kontext-2B transformer/config.json) and the DeepGen conditioning shapes.
FULL = dict(
    dit=dict(sample_size=128, patch_size=2, in_channels=16, out_channels=16, num_layers=24, num_attention_heads=24,
             attention_head_dim=64, joint_attention_dim=4096, caption_projection_dim=1536, pooled_projection_dim=2048,
             pos_embed_max_size=384, dual_attention_layers=tuple(range(13)), qk_norm="rms_norm"),
    vae=dict(block_out_channels=(128, 256, 512, 512), layers_per_block=2, norm_num_groups=32),
    connector=dict(hidden_size=2048, num_hidden_layers=6, num_attention_heads=32, intermediate_size=11946),
    vlm_hidden=2048, fused_layers=6, prompt_tokens=256, num_queries=128,
)
TINY = dict(
    dit=dict(sample_size=32, patch_size=2, in_channels=16, out_channels=16, num_layers=2, num_attention_heads=2,
             attention_head_dim=16, joint_attention_dim=64, caption_projection_dim=32, pooled_projection_dim=64,
             pos_embed_max_size=32, dual_attention_layers=(0,), qk_norm="rms_norm"),
    vae=dict(block_out_channels=(16, 16, 32, 32), layers_per_block=1, norm_num_groups=8),
    connector=dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128),
    vlm_hidden=64, fused_layers=2, prompt_tokens=64, num_queries=16,
)
PEAKS = {"H200": 989.0, "H100": 989.0, "A100": 312.0}  # dense bf16 TFLOP/s


def dit_forward_flops(dit: dict, batch: int, latent_hw: int, text_tokens: int) -> dict[str, float]:
    """Matmul FLOPs (2 per multiply-add) of one SD3 DiT forward, by component. Elementwise ops, norms, softmax are
    not counted (< 1%).

    D = heads x head_dim (= caption_projection_dim), N = (latent_hw / patch)^2 image tokens, L text tokens,
    S = N + L, J = joint_attention_dim, P = pooled dim, c = in_channels, p = patch, blocks 0..K-1, the last block is
    "context pre-only" (no text output projection / text MLP), dual blocks (``dual_attention_layers``) add a second,
    image-only attention. Per sample:
      patch_embed     2 N (c p^2) D                 context_embedder  2 L J D
      time/text emb   2 (256 D + D^2 + P D + D^2)  (timestep MLP 256->D->D, pooled MLP P->D->D)
      per block:  image QKV 6 N D^2, image out 2 N D^2, image MLP 16 N D^2;
                  text QKV 6 L D^2, text out 2 L D^2, text MLP 16 L D^2 (not in the last block);
                  joint attention QK^T + AV 4 S^2 D;  adaLN 2 D (6D) image (9D in dual blocks), 2 D (6D) text
                  (2D in the last block);  dual blocks: QKV2 6 N D^2, out2 2 N D^2, attention2 4 N^2 D
      norm_out        2 D (2D)                      proj_out          2 N D (p^2 c)
    """
    D = dit["num_attention_heads"] * dit["attention_head_dim"]
    p, c = dit["patch_size"], dit["in_channels"]
    N, L = (latent_hw // p) ** 2, text_tokens
    S, J, P, K = N + L, dit["joint_attention_dim"], dit["pooled_projection_dim"], dit["num_layers"]
    dual = set(dit["dual_attention_layers"])
    f = {"patch_embed": 2 * N * c * p * p * D, "context_embedder": 2 * L * J * D,
         "time_text_embed": 2 * (256 * D + D * D + P * D + D * D),
         "image_linear": 0.0, "text_linear": 0.0, "joint_attention": 0.0, "dual_attention": 0.0, "adaln": 0.0,
         "final": 2 * D * 2 * D + 2 * N * D * p * p * c}
    for i in range(K):
        last = i == K - 1
        f["image_linear"] += (6 + 2 + 16) * N * D * D
        f["text_linear"] += 6 * L * D * D + (0 if last else (2 + 16) * L * D * D)
        f["joint_attention"] += 4 * S * S * D
        f["adaln"] += 2 * D * (9 * D if i in dual else 6 * D) + 2 * D * (2 * D if last else 6 * D)
        if i in dual:
            f["dual_attention"] += (6 + 2) * N * D * D + 4 * N * N * D
    return {k: float(v) * batch for k, v in f.items()}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="full", choices=["full", "tiny"], help="model sizes (see FULL / TINY)")
    p.add_argument("--batch", type=int, default=None, help="rollout micro-batch (default: full 32, tiny 4)")
    p.add_argument("--train-batch", type=int, default=None, help="training micro-batch (default: full 32, tiny 4)")
    p.add_argument("--image-size", type=int, default=None, help="square image side (default: full 512, tiny 128)")
    p.add_argument("--num-inference-steps", type=int, default=50, help="T of the rollout images/s figure")
    p.add_argument("--iters", type=int, default=10, help="timed iterations per measurement")
    p.add_argument("--warmup", type=int, default=3, help="untimed iterations first")
    p.add_argument("--gradient-checkpointing", default="on", choices=["on", "off"],
                   help="activation checkpointing in the DiT for the training piece (the trainer's default: on)")
    p.add_argument("--dtype", default=None, choices=["bf16", "fp32"], help="default: bf16 on GPU, fp32 on CPU")
    p.add_argument("--master-weights", default="fp32", choices=["fp32", "compute"],
                   help="DiT parameter dtype: fp32 master weights + autocast to --dtype (the trainer's choice), or "
                        "the compute dtype itself")
    p.add_argument("--peak_tflops", type=float, default=None, help="roofline TFLOP/s (default: from the GPU name)")
    p.add_argument("--no-vae", action="store_true", help="skip the VAE decode measurement")
    p.add_argument("--check-flops", action="store_true", help="compare the formula with FlopCounterMode")
    p.add_argument("--flops-only", action="store_true",
                   help="print the analytic FLOP table of the config (checked with FlopCounterMode on the meta "
                        "device) without building or timing anything: the full config's numbers on any machine")
    p.add_argument("--deepspeed", default="zero2", choices=["zero2", "none"],
                   help="zero2: the DiT in a DeepSpeed ZeRO-2 engine (scripts/deepspeed/zero2.json, bf16 as train.sh); "
                        "none: fp32 master weights + autocast")
    p.add_argument("--sft-batch", type=int, default=4, help="image-caption pairs of the SFT-term forward+backward")
    p.add_argument("--vlm-params", type=float, default=None,
                   help="parameters of the VLM whose bf16 weights are held as a placeholder (default: full 3.75e9, "
                        "tiny 0)")
    p.add_argument("--allow-cpu", action="store_true", help="run without CUDA (tiny configs; numbers are not GPU's)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--smoke", action="store_true", help="tiny config, 64 px, batch 2, 2 iterations, --check-flops")
    args = p.parse_args(argv)
    if args.smoke:
        args.allow_cpu, args.sft_batch = True, 2
        args.config, args.batch, args.train_batch, args.image_size = "tiny", 2, 2, 64
        args.num_inference_steps, args.iters, args.warmup, args.check_flops = 4, 2, 1, True
    full = args.config == "full"
    args.batch = args.batch or (32 if full else 4)
    args.train_batch = args.train_batch or (32 if full else 4)
    args.image_size = args.image_size or (512 if full else 128)
    if args.vlm_params is None:
        args.vlm_params = 3.75e9 if full else 0.0
    return args


def timed(fn, iters: int, warmup: int, device) -> float:
    """Median seconds of ``fn()`` (device-synchronised)."""
    import torch

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t)
    return median(times)


def counted_dit_flops(dit_cfg: dict, batch: int, latent_hw: int, text_tokens: int) -> float:
    """FLOPs ``FlopCounterMode`` counts for one forward of a DiT of ``dit_cfg`` built on the meta device (no memory,
    no compute, so the full 2.2 B-parameter model is checked on any machine). SDPA runs in its math form so the
    attention shows up as matmuls."""
    import torch
    from diffusers import SD3Transformer2DModel
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    with torch.device("meta"):
        dit = SD3Transformer2DModel(**dit_cfg)
        x = torch.empty(batch, dit_cfg["in_channels"], latent_hw, latent_hw)
        prompt = torch.empty(batch, text_tokens, dit_cfg["joint_attention_dim"])
        pooled = torch.empty(batch, dit_cfg["pooled_projection_dim"])
        t = torch.empty(batch)
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        dit(hidden_states=x, encoder_hidden_states=prompt, pooled_projections=pooled, timestep=t, return_dict=False)
    return float(counter.get_total_flops())


def print_flop_table(fwd_flops: dict[str, float], hw: int, text_tokens: int) -> float:
    total = sum(fwd_flops.values())
    print_table(f"analytic DiT forward FLOPs per image ({(hw // 2) ** 2} + {text_tokens} tokens)",
                ["component", "GFLOP", "share"],
                [[k, v / 1e9, f"{100 * v / total:.1f}%"] for k, v in fwd_flops.items()]
                + [["total", total / 1e9, "100%"]],
                ["", ".4f" if total < 1e10 else ".1f", ""])
    return total


def print_flops_only(cfg: dict, args) -> int:
    hw, L, T = args.image_size // 8, cfg["prompt_tokens"] + cfg["num_queries"], args.num_inference_steps
    f1 = print_flop_table(dit_forward_flops(cfg["dit"], 1, hw, L), hw, L)
    counted = counted_dit_flops(cfg["dit"], 1, hw, L)
    print(f"\nper image: rollout T={T} forwards = {T * f1 / 1e12:.1f} TFLOP; one trained timestep (fwd+bwd) = "
          f"{3 * f1 / 1e12:.2f} TFLOP (+{f1 / 1e12:.2f} recomputed with activation checkpointing)")
    if args.peak_tflops:
        print(f"at {args.peak_tflops:g} TFLOP/s: rollout >= {T * f1 / 1e12 / args.peak_tflops:.3f} s per image")
    print_ratio("analytic / FlopCounterMode DiT forward FLOPs", f1 / counted)
    print_rerun(__file__, threads=args.threads)
    return 0


def build_engine(dit, dtype, device):
    """The DiT in a DeepSpeed engine from scripts/deepspeed/zero2.json, "auto" resolved as the trainer does."""
    import os
    from types import SimpleNamespace

    import deepspeed
    import torch

    from deepgen_rl.trainer.deepspeed_utils import build_deepspeed_config, dit_hidden_size, skip_cpu_shm_comm_op

    skip_cpu_shm_comm_op()  # the CPU run: no compile of an op DeepSpeed does not use
    if not torch.distributed.is_initialized():
        if "RANK" not in os.environ:  # a single process without torchrun
            from deepgen_rl.services.ocr.launch import free_port

            os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                              MASTER_PORT=str(free_port()))
        deepspeed.init_distributed(dist_backend="nccl" if device.type == "cuda" else "gloo")
    world = torch.distributed.get_world_size()
    hp = SimpleNamespace(max_grad_norm=1.0, bf16=dtype == torch.bfloat16, fp16=False, learning_rate=1e-6,
                         weight_decay=0.0, adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8)
    cfg = build_deepspeed_config(Path(__file__).resolve().parents[1] / "scripts/deepspeed/zero2.json", hp, world,
                                 hidden_size=dit_hidden_size(dit))
    optimizer = torch.optim.AdamW([p for p in dit.parameters() if p.requires_grad], lr=1e-6)
    engine, _, _, _ = deepspeed.initialize(model=dit, optimizer=optimizer, config=cfg, dist_init_required=False)
    return engine, world


def main(argv=None) -> int:
    args = parse_args(argv)
    setup_env(args.threads)
    import torch

    if not torch.cuda.is_available() and not (args.allow_cpu or args.flops_only):
        print("gpu_throughput: no CUDA device; this measures the GPU recipe (--smoke or --allow-cpu for a CPU run of "
              "a tiny config, --flops-only for the FLOP table)", file=sys.stderr)
        return 2
    from diffusers import AutoencoderKL, SD3Transformer2DModel

    from deepgen_rl.models.deepgen.connector import Connector, ConnectorConfig
    from deepgen_rl.rl.samplers import DEFAULT_SDE_SAMPLER, make_sigmas, sde_step

    cfg = FULL if args.config == "full" else TINY
    if args.flops_only:
        return print_flops_only(cfg, args)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype or ("bf16" if device.type == "cuda" else "fp32")]
    gpu = torch.cuda.get_device_name(0) if device.type == "cuda" else "CPU"
    peak = args.peak_tflops or next((v for k, v in PEAKS.items() if k in gpu), None)
    torch.manual_seed(0)

    t_build = time.perf_counter()
    dit_dtype = torch.float32 if args.master_weights == "fp32" or args.deepspeed == "zero2" else dtype
    use_autocast = args.deepspeed == "none" and dit_dtype != dtype
    autocast = (lambda: torch.autocast(device.type, dtype=dtype)) if use_autocast else nullcontext
    vlm_placeholder = torch.empty(int(args.vlm_params), dtype=torch.bfloat16, device=device) if args.vlm_params else None
    with torch.device(device):  # random init directly on the device (the full DiT has 2.24 B parameters)
        dit = SD3Transformer2DModel(**cfg["dit"]).to(dit_dtype)
        levels = len(cfg["vae"]["block_out_channels"])
        vae = None if args.no_vae else AutoencoderKL(
            in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * levels,
            up_block_types=("UpDecoderBlock2D",) * levels, latent_channels=16,
            scaling_factor=1.5305, shift_factor=0.0609, use_quant_conv=False, use_post_quant_conv=False,
            **cfg["vae"]).to(dtype).eval().requires_grad_(False)
        ccfg = ConnectorConfig(**cfg["connector"])
        connector = Connector(ccfg).to(dtype).eval().requires_grad_(False)
        fused_width = cfg["vlm_hidden"] * cfg["fused_layers"]
        proj1 = torch.nn.Linear(fused_width, ccfg.hidden_size).to(dtype).requires_grad_(False)
        proj2 = torch.nn.Linear(ccfg.hidden_size, cfg["dit"]["pooled_projection_dim"]).to(dtype).requires_grad_(False)
        proj3 = torch.nn.Linear(ccfg.hidden_size, cfg["dit"]["joint_attention_dim"]).to(dtype).requires_grad_(False)
    n_params = sum(p.numel() for p in dit.parameters())
    from deepgen_rl.trainer.deepspeed_utils import dit_from_state

    ref_dit = dit_from_state(dit, dit.state_dict(), device=device, dtype=dtype)  # frozen KL reference, as trainer
    engine, world = None, 1
    if args.deepspeed == "zero2":
        engine, world = build_engine(dit, dtype, device)
        dit = engine.module
    t_build = time.perf_counter() - t_build

    B, Bt, hw = args.batch, args.train_batch, args.image_size // 8
    L = cfg["prompt_tokens"] + cfg["num_queries"]
    fused = torch.randn(B, L, cfg["vlm_hidden"] * cfg["fused_layers"], device=device, dtype=dtype)

    def encode(batch_fused):
        with torch.no_grad():
            x = connector(proj1(batch_fused))
            return proj3(x), proj2(x.float().mean(1).to(dtype))

    prompt_embeds, pooled = encode(fused)
    sigmas = make_sigmas(args.num_inference_steps, 3.0)
    sig, sig_next = float(sigmas[1]), float(sigmas[2])

    def velocity(x, s, pe, po, module=None):  # as DeepGen.predict_velocity: timestep = sigma * 1000, DiT dtype
        module = module if module is not None else dit
        mdtype = next(module.parameters()).dtype
        t = torch.full((x.shape[0],), s * 1000.0, device=device, dtype=torch.float32)
        with autocast():
            return module(hidden_states=x.to(mdtype), encoder_hidden_states=pe.to(mdtype),
                          pooled_projections=po.to(mdtype), timestep=t, return_dict=False)[0].float()

    x = torch.randn(B, 16, hw, hw, device=device)

    def rollout_step():
        with torch.no_grad():
            v = velocity(x, sig, prompt_embeds, pooled)
            return sde_step(DEFAULT_SDE_SAMPLER, v, x, sig, sig_next, 0.7).prev_sample

    xt = torch.randn(Bt, 16, hw, hw, device=device)
    xt_next = rollout_step()[:Bt] if Bt <= B else torch.randn_like(xt)
    pe_t, po_t = prompt_embeds[:1].expand(Bt, -1, -1).contiguous(), pooled[:1].expand(Bt, -1).contiguous()
    old_lp = torch.zeros(Bt, device=device)
    adv = torch.randn(Bt, device=device)
    optimizer = torch.optim.AdamW(dit.parameters(), lr=1e-6) if engine is None else None
    trained = engine if engine is not None else dit  # trained forwards go through the engine (as the trainer)

    def backward(loss, boundary=False):
        if engine is not None:
            engine.set_gradient_accumulation_boundary(boundary)
            engine.backward(loss)
        else:
            loss.backward()

    def train_piece(boundary=False):
        v = velocity(xt, sig, pe_t, po_t, trained)
        with torch.no_grad():
            v_ref = velocity(xt, sig, pe_t, po_t, ref_dit)
            ref_mean = sde_step(DEFAULT_SDE_SAMPLER, v_ref, xt, sig, sig_next, 0.7, prev_sample=xt_next).mean
        out = sde_step(DEFAULT_SDE_SAMPLER, v, xt, sig, sig_next, 0.7, prev_sample=xt_next)
        kl = ((out.mean - ref_mean) ** 2).flatten(1).mean(1)
        backward((-(adv * torch.exp(out.log_prob - old_lp)) + 5e-7 * kl).mean(), boundary)

    Bs = args.sft_batch
    x0_s, eps_s = torch.randn(Bs, 16, hw, hw, device=device), torch.randn(Bs, 16, hw, hw, device=device)
    pe_s, po_s = prompt_embeds[:1].expand(Bs, -1, -1).contiguous(), pooled[:1].expand(Bs, -1).contiguous()

    def sft_piece():
        s_ = 0.6
        v = velocity((1 - s_) * x0_s + s_ * eps_s, s_, pe_s, po_s, trained)
        backward(1e-4 * ((v - (eps_s - x0_s)) ** 2).mean())

    def optimizer_step():
        if engine is not None:
            train_piece(boundary=True)
            engine.step()
        else:
            optimizer.step()
            optimizer.zero_grad(set_to_none=False)

    rows = []
    fwd_flops = dit_forward_flops(cfg["dit"], 1, hw, L)
    f1 = sum(fwd_flops.values())
    mem = {}

    def record(name, seconds, flops, note=""):
        tflops = flops / seconds / 1e12 if flops else float("nan")
        rows.append([name, seconds * 1e3, flops / 1e9 if flops else float("nan"), tflops,
                     tflops / peak if (peak and flops) else float("nan"), note])

    def reset_peak():
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()

    def peak_gib():
        return torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else float("nan")

    dit.eval()
    reset_peak()
    t_enc = timed(lambda: encode(fused), args.iters, args.warmup, device)
    record(f"connector+projectors ({B} prompts)", t_enc, 0.0, "VLM not run")
    t_roll = timed(rollout_step, args.iters, args.warmup, device)
    record(f"rollout step: DiT fwd + sde_step (B={B})", t_roll, f1 * B)
    t_dec = 0.0
    if vae is not None:
        def decode():
            with torch.no_grad():
                return vae.decode(x.to(dtype) / 1.5305 + 0.0609, return_dict=False)[0]
        t_dec = timed(decode, max(1, args.iters // 2), 1, device)
        record(f"VAE decode (B={B})", t_dec, 0.0, "not counted")
    mem["rollout"] = peak_gib()

    dit.train()
    if args.gradient_checkpointing == "on":
        dit.enable_gradient_checkpointing()
    reset_peak()
    t_train = timed(train_piece, args.iters, args.warmup, device)
    record(f"train piece: DiT fwd+bwd + ref fwd (B={Bt})", t_train, 4 * f1 * Bt,
           ("ckpt: +1 fwd not counted; " if args.gradient_checkpointing == "on" else "")
           + ("ZeRO-2 reduction inside" if engine is not None else "no DeepSpeed"))
    t_sft = timed(sft_piece, args.iters, args.warmup, device)
    record(f"SFT term: DiT fwd+bwd (B={Bs})", t_sft, 3 * f1 * Bs, "")
    t_opt = timed(optimizer_step, max(1, args.iters // 2), 1, device)
    if engine is not None:
        t_opt = max(t_opt - t_train, 0.0)
    record("AdamW step (all DiT params)" + (" via engine.step()" if engine is not None else ""), t_opt, 0.0,
           f"fp32 masters over {world} rank(s)" if engine is not None else "")
    mem["train"] = peak_gib()

    T = args.num_inference_steps
    img_s = B / (T * t_roll + t_dec)
    print(f"\nDiT throughput: config {args.config!r} ({n_params / 1e9:.3f} B DiT params, built in {t_build:.1f} s with "
          f"random weights), {gpu}, {str(dtype).replace('torch.', '')} compute, "
          f"{str(dit_dtype).replace('torch.', '')} DiT weights, {args.image_size}x{args.image_size} px -> "
          f"{hw}x{hw} latents = {(hw // 2) ** 2} image tokens + {L} text tokens "
          f"({cfg['prompt_tokens']} prompt + {cfg['num_queries']} think; random conditioning: the VLM is not run), "
          f"gradient checkpointing {args.gradient_checkpointing}; medians of {args.iters} after {args.warmup} warm-up; "
          f"peak {'%g TFLOP/s' % peak if peak else 'unknown (pass --peak_tflops)'}; {load_note()}")
    print_table("timings", ["measurement", "ms", "GFLOP", "TFLOP/s", "of peak", "note"], rows,
                ["", ".2f", ".1f" if f1 * B > 1e11 else ".4f", ".2f" if f1 * B > 1e11 else ".5f", ".1%", ""])
    print_flop_table(fwd_flops, hw, L)
    print(f"\nrollout: {img_s:.3f} images/s at T={T} (= B / (T x step + decode)); training: {t_train * 1e3:.1f} ms per "
          f"trained (micro-batch of {Bt}, timestep) piece, {Bt / t_train:.2f} image-timesteps/s; "
          f"peak memory rollout {mem['rollout']:.1f} GiB, train {mem['train']:.1f} GiB")
    print(f"per-rank recipe memory ({'DeepSpeed ZeRO-2 over %d rank(s)' % world if engine is not None else 'no DeepSpeed'}"
          f"; DiT + reference DiT + connector + VAE + VLM placeholder {2 * args.vlm_params / 1e9:.1f} GB): peak "
          f"{max(mem.values()):.1f} GiB allocated (activations at rollout batch {B}, train batch {Bt})")
    if args.check_flops:
        counted = counted_dit_flops(cfg["dit"], 1, hw, L)
        print(f"FlopCounterMode (meta-device DiT, SDPA math): {counted / 1e9:.3f} GFLOP per image forward")
        print_ratio("analytic / FlopCounterMode DiT forward FLOPs", f1 / counted)
    print_ratio("train piece time / rollout step time (per image)", (t_train / Bt) / (t_roll / B))
    if peak:
        print_ratio("rollout step TFLOP/s / peak", f1 * B / t_roll / 1e12 / peak)
        print_ratio("train piece TFLOP/s / peak", 3 * f1 * Bt / t_train / 1e12 / peak)
    print_rerun(__file__, threads=args.threads if device.type == "cpu" else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
