"""Subprocess worker (one per rank, gloo): which checkpoint does auto-resume choose? Writes {"rank", "path"} JSON.

Rank 0's clean-up of ``.tmp``/``.old`` folders is slowed down by 1.5 s, so a rank that decided on its own (instead
of waiting for rank 0's decision) would see the folders before they are promoted.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import time
from pathlib import Path

import torch.distributed as tdist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main():
    output_dir, result = sys.argv[1], sys.argv[2]
    tdist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = tdist.get_rank()
    from deepgen_rl.checkpoints import rl_format as fmt
    from deepgen_rl.checkpoints.training_state import find_resume_checkpoint

    slow = fmt.remove_stale_tmp

    def slow_cleanup(out):
        time.sleep(1.5)
        return slow(out)

    fmt.remove_stale_tmp = slow_cleanup
    path = find_resume_checkpoint(output_dir, None)
    Path(result).write_text(json.dumps({"rank": rank, "path": path.name if path else None}))
    tdist.barrier()
    tdist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
    from deepgen_rl.utils.dist import exit_without_teardown

    exit_without_teardown()  # results are out: no interpreter teardown (its gloo abort, deepgen_rl.utils.dist)
