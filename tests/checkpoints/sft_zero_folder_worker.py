"""Write a tiny DeepGen SFT checkpoint the way the SFT training saves it (single process, CPU, gloo).

    python tests/checkpoints/sft_zero_folder_worker.py WORK_DIR

As mmengine's DeepSpeed strategy does: the engine wraps the whole DeepGen model with its SFT tensors trainable (VLM
LoRA, connector, projectors, meta_queries, DiT), and after 2 ZeRO-2 Adam steps
``engine.save_checkpoint(WORK_DIR, tag="iter_2.pth", save_latest=False, exclude_frozen_parameters=True)`` writes the
folder ``WORK_DIR/iter_2.pth/``. The trained tensors go to ``WORK_DIR/reference.safetensors`` (the ground truth).

``encode_prompts`` runs without gradients, so the velocity loss alone would move only the DiT and leave the LoRA,
connector, projectors and think tokens at their start values (a load test could then pass without reading them).
The loss therefore adds ``PULL · Σ_p Σ w_p`` over every trainable tensor: a gradient of PULL on every element, so each
Adam step moves every element of every SFT tensor by about the learning rate (deterministic: fixed seeds, one process).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import deepspeed
import torch
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
PULL = 1e-3


def main() -> None:
    out = Path(sys.argv[1])
    from deepgen_rl.trainer.deepspeed_utils import init_deepspeed_distributed

    init_deepspeed_distributed("gloo")
    from deepgen_rl.checkpoints.sft import is_sft_key
    from deepgen_rl.models import build_model

    model = build_model(str(ROOT / "configs/models/deepgen_tiny.py"))
    for name, p in model.named_parameters():
        p.requires_grad_(is_sft_key(name))
    trainable = [p for p in model.parameters() if p.requires_grad]
    config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
              "zero_optimization": {"stage": 2}, "steps_per_print": 10**9,
              "optimizer": {"type": "Adam", "params": {"lr": 1e-2, "torch_adam": True}}}
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=trainable, config=config)
    gen = torch.Generator().manual_seed(3)
    for _ in range(2):
        cond = model.encode_prompts(["a red circle", "the word GO"])  # through the LoRA VLM, connector, projectors
        latents = torch.randn(2, 16, 8, 8, generator=gen)
        velocity = model.predict_velocity(latents, torch.rand(2, generator=gen), cond)
        pull = sum(p.sum() for p in trainable)  # reaches the parts encode_prompts (no_grad) does not
        engine.backward((velocity - latents).pow(2).mean() + PULL * pull)
        engine.step()
    engine.save_checkpoint(str(out), tag="iter_2.pth", save_latest=False, exclude_frozen_parameters=True)
    ref = {n: p.detach().clone().contiguous() for n, p in engine.module.named_parameters() if p.requires_grad}
    save_file(ref, str(out / "reference.safetensors"))
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
    from deepgen_rl.utils.dist import exit_without_teardown

    exit_without_teardown()  # results are out: no interpreter teardown (its gloo abort, deepgen_rl.utils.dist)
