"""Start the reward server in a subprocess and wait until it answers /health (used by tests and bench)."""
from __future__ import annotations

import json
import os
import sys

from deepgen_rl.services.ocr.launch import ServiceProcess, free_port


class RewardServerProcess(ServiceProcess):
    """``with RewardServerProcess(["brightness"]) as srv: srv.url`` -- a real reward server on a free port."""

    what = "reward server"
    stop_timeout_s = 20.0

    def __init__(self, rewards: list[str], reward_kwargs: dict | None = None, *, env: dict[str, str] | None = None,
                 args: list[str] | None = None, startup_timeout_s: float = 120.0, log_path: str | None = None):
        self.port = free_port()
        argv = [sys.executable, "-m", "deepgen_rl.services.reward", "--log-level", "warning"]
        for name in rewards:
            argv += ["--reward", name]
        argv += ["--reward_kwargs", json.dumps(reward_kwargs or {}), *(args or [])]
        env = {**os.environ, **(env or {}), "REWARD_HOST": "127.0.0.1", "REWARD_PORT": str(self.port)}
        super().__init__(argv, env, f"http://127.0.0.1:{self.port}", startup_timeout_s=startup_timeout_s,
                         log_path=log_path)

    def rss_bytes(self) -> int:
        """Resident set size of the server process (Linux /proc)."""
        with open(f"/proc/{self.process.pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise RuntimeError("VmRSS not found")
