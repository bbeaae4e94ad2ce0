"""Write a real 2-process DeepSpeed ZeRO-2 RL checkpoint of the tiny DiT (CPU, gloo), without dit.safetensors.

    torchrun --nproc_per_node 2 tests/sft/zero2_checkpoint_worker.py CHECKPOINT_DIR

The engine wraps the DiT itself (as the trainer does). After 2 Adam steps on a dummy velocity loss it saves
``CHECKPOINT_DIR/deepspeed`` (tag ``global_step2``) and ``checkpoint_meta.json``; every rank also writes the DiT
weights it holds to ``CHECKPOINT_DIR/reference_rank{r}.safetensors`` (the ground truth for the converter test).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import deepspeed
import torch
import torch.distributed as dist
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # run as a script by torchrun: make the repo importable without installing it
STEPS = 2


def main() -> None:
    out = Path(sys.argv[1])
    from deepgen_rl.trainer.deepspeed_utils import init_deepspeed_distributed

    init_deepspeed_distributed("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    from deepgen_rl.models import build_model

    model = build_model(str(ROOT / "configs/models/deepgen_tiny.py"))
    config = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": 2},
        "optimizer": {"type": "Adam", "params": {"lr": 1e-2, "torch_adam": True}},
        "steps_per_print": 10**9,
    }
    engine, _, _, _ = deepspeed.initialize(model=model.transformer, model_parameters=model.trainable_parameters(),
                                           config=config)
    gen = torch.Generator().manual_seed(100 + rank)  # different data per rank, as in real training
    with torch.no_grad():
        cond = model.encode_prompts(["a red circle", "the word GO"])
    for _ in range(STEPS):
        latents = torch.randn(2, 16, 8, 8, generator=gen)
        sigma = torch.rand(2, generator=gen)
        velocity = model.predict_velocity(latents, sigma, cond, transformer=engine)
        loss = (velocity - latents).pow(2).mean()
        engine.backward(loss)
        engine.step()
    engine.save_checkpoint(str(out / "deepspeed"), tag=f"global_step{STEPS}")
    state = {k: v.detach().clone().contiguous() for k, v in engine.module.state_dict().items()}
    save_file(state, str(out / f"reference_rank{rank}.safetensors"))
    if rank == 0:
        meta = {"format": "deepgen_rl.checkpoint.v1", "global_step": STEPS, "zero_stage": 2,
                "world_size": world_size, "has_ema": False, "dit_dtype": "float32"}
        (out / "checkpoint_meta.json").write_text(json.dumps(meta, indent=2))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
    from deepgen_rl.utils.dist import exit_without_teardown

    exit_without_teardown()  # results are out: no interpreter teardown (its gloo abort, deepgen_rl.utils.dist)
