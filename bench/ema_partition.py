"""EMA per rank: the partitioned EMA of the fp32 masters (``PartitionedEMA``) vs a full fp32 EMA copy updated from
masters gathered every step (what the trainer did before), side by side in one 2-process gloo run on the CPU.

For ZeRO-2 and a ZeRO-3 that partitions every parameter, on a stack of ``--layers`` Linear(``--width``, ``--width``):
EMA bytes held per rank and the time of one EMA update (median over ``--rounds`` rounds, the two updates alternating
round by round). Both EMAs see the same masters (no optimizer step in between), so after the rounds the gathered
partitioned EMA must equal the full copy; the bench prints that difference. Runs itself under
``torch.distributed.run --nproc_per_node 2`` when started with plain ``python``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, load_note, median, print_ratio, print_rerun, print_table, run_under_torchrun, \
    setup_env  # noqa: E402

DECAY = 0.9


class Args:  # what build_deepspeed_config reads
    max_grad_norm, learning_rate, weight_decay, bf16, fp16 = 0.0, 1e-3, 0.0, False, False
    adam_beta1, adam_beta2, adam_epsilon = 0.9, 0.999, 1e-8


def worker(opts) -> None:
    import torch
    import deepspeed

    from deepgen_rl.trainer.deepspeed_utils import build_deepspeed_config, fp32_master_params
    from deepgen_rl.trainer.ema import PartitionedEMA
    from deepgen_rl.utils.dist import exit_without_teardown

    torch.distributed.init_process_group("gloo")
    from deepgen_rl.trainer.deepspeed_utils import init_deepspeed_distributed

    init_deepspeed_distributed("gloo")
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    rows, results = [], {}
    for name in ("zero2", "zero3_all"):
        shipped = "zero2.json" if name == "zero2" else "zero3.json"
        cfg = json.loads((ROOT / "scripts/deepspeed" / shipped).read_text())
        if name == "zero3_all":
            cfg["zero_optimization"].update({"stage3_param_persistence_threshold": 0})
        torch.manual_seed(0)
        module = torch.nn.Sequential(*[torch.nn.Linear(opts.width, opts.width) for _ in range(opts.layers)])
        opt = torch.optim.AdamW(module.parameters(), lr=1e-3)
        ds_cfg = build_deepspeed_config(cfg, Args(), world, gloo=True)
        engine, *_ = deepspeed.initialize(model=module, optimizer=opt, config=ds_cfg, dist_init_required=False)
        part = PartitionedEMA(module, engine)
        full = {n: t.clone() for n, t in fp32_master_params(module, engine)}
        t_full, t_part = [], []
        for _ in range(opts.rounds):
            torch.distributed.barrier()
            t0 = time.perf_counter()
            with torch.no_grad():
                for n, master in fp32_master_params(module, engine):  # a collective per parameter
                    full[n].mul_(DECAY).add_(master, alpha=1 - DECAY)
            t_full.append(time.perf_counter() - t0)
            torch.distributed.barrier()
            t0 = time.perf_counter()
            part.update(DECAY)  # local
            t_part.append(time.perf_counter() - t0)
        gathered = part.full_state_dict()
        diff = max(float((gathered[n] - full[n]).abs().max()) for n in full)
        bytes_full = 4 * sum(t.numel() for t in full.values())
        bytes_part = 4 * part.numel_local()
        results[name] = dict(t_full=median(t_full), t_part=median(t_part), bytes_full=bytes_full,
                             bytes_part=bytes_part, diff=diff)
        rows.append([name, bytes_full / 2**20, bytes_part / 2**20, median(t_full) * 1e3, median(t_part) * 1e3, diff])
        if hasattr(engine, "destroy"):
            engine.destroy()
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    if rank == 0:
        report(opts, world, rows, results)
    exit_without_teardown()


def report(opts, world: int, rows: list, results: dict) -> None:
    n_params = opts.layers * (opts.width * opts.width + opts.width)
    print(f"{world} gloo processes, {opts.layers} x Linear({opts.width}, {opts.width}) = {n_params / 1e6:.2f} M "
          f"params, {opts.rounds} rounds; {load_note()}")
    print_table("EMA per rank (rank 0): full fp32 copy gathered every step vs PartitionedEMA",
                ["config", "full MiB", "partitioned MiB", "full update ms", "partitioned update ms", "max |diff|"],
                rows, ["", ".2f", ".2f", ".2f", ".2f", ".1e"])
    for name, r in results.items():
        print_ratio(f"ema_bytes partitioned/full ({name}, {world} ranks)", r["bytes_part"] / r["bytes_full"],
                    f"<= {1 / world + 0.05:.2f}")
        print_ratio(f"ema_update_time partitioned/full ({name})", r["t_part"] / r["t_full"])
    print_rerun(__file__, threads=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, 3 rounds (seconds)")
    opts = parser.parse_args()
    if opts.smoke:
        opts.width, opts.layers, opts.rounds = 96, 2, 3
    setup_env(1)
    if "RANK" not in os.environ:  # start the 2 processes
        run_under_torchrun(__file__, 2)
    worker(opts)


if __name__ == "__main__":
    main()
