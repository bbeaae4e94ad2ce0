"""One rank of a multi-process toy build (``deepgen_rl.toy.build_ranks.run_build_ranks`` launches it; not by hand):
joins the ranks' gloo group over the build folder's ``FileStore``, runs the build's stages on its slice of each batch
(``deepgen_rl.toy.pretrain.build_parts``) and, as rank 0, leaves the statistics for the launcher."""

from __future__ import annotations

import datetime
import json
import os

import torch.distributed as dist

from .build_ranks import COLLECTIVE_TIMEOUT_S, CONFIG_FILE, STATS_FILE, STORE_FILE


def main(argv=None) -> int:
    """One rank of ``run_build_ranks`` (module docstring)."""
    import argparse

    from .pretrain import build_parts

    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("--out", required=True)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--no_progress", action="store_true")
    a = p.parse_args(argv)
    with open(os.path.join(a.out, CONFIG_FILE)) as f:
        cfg = json.load(f)
    dist.init_process_group("gloo", init_method=f"file://{os.path.abspath(os.path.join(a.out, STORE_FILE))}",
                            rank=a.rank, world_size=a.world,
                            timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    try:
        stats = build_parts(a.out, cfg, progress=not a.no_progress)
        if a.rank == 0:
            with open(os.path.join(a.out, STATS_FILE), "w") as f:
                json.dump(stats, f)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
