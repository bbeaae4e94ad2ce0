"""Experiment loggers. HF's callbacks do the logging; SwanLab's run is opened here first because the pinned
swanlab (0.10.x) raises from ``get_run()`` when no run exists, which HF's SwanLabCallback does not expect."""

from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)


def init_swanlab(args) -> None:
    """Open the SwanLab run on rank 0 (SWANLAB_PROJ_NAME, SWANLAB_MODE [offline], SWANLAB_LOG_DIR)."""
    import swanlab

    try:
        if swanlab.get_run() is not None:
            return
    except RuntimeError:
        pass  # no active run yet
    swanlab.init(project=os.environ.get("SWANLAB_PROJ_NAME") or os.environ.get("SWANLAB_PROJECT") or "DeepGen-RL",
                 name=args.run_name, mode=os.environ.get("SWANLAB_MODE", "offline"),
                 log_dir=os.environ.get("SWANLAB_LOG_DIR") or os.path.join(args.output_dir, "swanlog"),
                 config=args.to_dict())


def active_swanlab_run():
    try:
        import swanlab

        return swanlab.get_run()
    except (ImportError, RuntimeError):
        return None
