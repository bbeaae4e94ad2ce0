"""torchrun worker (2 gloo processes) for tests/trainer/test_zero3_gather.py; rank 0 prints one JSON line.

Per mode, a module of 80 small Linear layers (every parameter partitioned: persistence threshold 0) goes into a ZeRO-3
engine built from ``scripts/deepspeed/zero3.json`` by ``build_deepspeed_config``; then all its parameters are gathered
at once (``gathered_params``, as the checkpoint save does for the rank digests) ``ROUNDS`` times and every gathered
tensor is compared with the value the module was built with. Modes: ``ours`` (``gloo=True``: what the trainer passes
on CPU) and ``coalesced`` (``gloo=False``: DeepSpeed's coalesced gather, the old behaviour).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from deepgen_rl.trainer.deepspeed_utils import (build_deepspeed_config, gathered_params,  # noqa: E402
                                                init_deepspeed_distributed)
from tests.trainer.helpers import ROOT  # noqa: E402

ROUNDS, LAYERS, WIDTH = 40, 80, 48


class Args:  # what build_deepspeed_config reads
    max_grad_norm, learning_rate, weight_decay, bf16, fp16 = 0.0, 0.0, 0.0, False, False
    adam_beta1, adam_beta2, adam_epsilon = 0.9, 0.999, 1e-8


def bad_reads(gloo: bool) -> dict:
    import deepspeed

    torch.manual_seed(0)
    module = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])
    expected = {n: p.detach().clone() for n, p in module.named_parameters()}
    cfg = json.loads((ROOT / "scripts/deepspeed/zero3.json").read_text())
    cfg["zero_optimization"]["stage3_param_persistence_threshold"] = 0
    ds_cfg = build_deepspeed_config(cfg, Args(), torch.distributed.get_world_size(), gloo=gloo)
    opt = torch.optim.SGD(module.parameters(), lr=0.0)
    engine, *_ = deepspeed.initialize(model=module, optimizer=opt, config=ds_cfg, dist_init_required=False)
    parted = sum(p.data.numel() == 0 for p in engine.module.parameters())
    bad = 0
    for _ in range(ROUNDS):
        with gathered_params(engine.module, 3):
            bad += sum(not torch.equal(p.detach(), expected[n]) for n, p in engine.module.named_parameters())
    totals = torch.tensor([bad, parted])
    torch.distributed.all_reduce(totals)
    return {"bad_reads": int(totals[0]), "partitioned": int(totals[1]),
            "reads": ROUNDS * len(expected) * torch.distributed.get_world_size(),
            "sequential": ds_cfg["zero_optimization"].get("stage3_allgather_sequential", False)}


def main() -> None:
    torch.set_num_threads(1)
    init_deepspeed_distributed("gloo")
    report = {mode: bad_reads(mode == "ours") for mode in sys.argv[1].split(",")}
    if torch.distributed.get_rank() == 0:
        print("GATHER_REPORT " + json.dumps(report), flush=True)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
    from deepgen_rl.utils.dist import exit_without_teardown

    exit_without_teardown()  # results are out: no interpreter teardown (its gloo abort, deepgen_rl.utils.dist)
