"""Start the reward server in a subprocess and wait until it answers /health (used by tests and bench)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import httpx

from deepgen_rl.services.ocr.launch import free_port


class RewardServerProcess:
    """``with RewardServerProcess(["brightness"]) as srv: srv.url`` -- a real reward server on a free port."""

    def __init__(self, rewards: list[str], reward_kwargs: dict | None = None, *, env: dict[str, str] | None = None,
                 args: list[str] | None = None, startup_timeout_s: float = 120.0, log_path: str | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {**os.environ, **(env or {}), "REWARD_HOST": "127.0.0.1", "REWARD_PORT": str(self.port)}
        package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
        self.env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, self.env.get("PYTHONPATH")]))
        self.argv = [sys.executable, "-m", "deepgen_rl.services.reward", "--log-level", "warning"]
        for name in rewards:
            self.argv += ["--reward", name]
        self.argv += ["--reward_kwargs", json.dumps(reward_kwargs or {}), *(args or [])]
        self.startup_timeout_s, self.log_path = startup_timeout_s, log_path
        self.process: subprocess.Popen | None = None

    def start(self) -> "RewardServerProcess":
        log = open(self.log_path, "wb") if self.log_path else subprocess.DEVNULL
        self.process = subprocess.Popen(self.argv, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"reward server exited with code {self.process.returncode} (log: {self.log_path})")
            try:
                if httpx.get(f"{self.url}/health", timeout=1.0).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        self.stop()
        raise TimeoutError(f"reward server did not answer {self.url}/health within {self.startup_timeout_s}s")

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def rss_bytes(self) -> int:
        """Resident set size of the server process (Linux /proc)."""
        with open(f"/proc/{self.process.pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise RuntimeError("VmRSS not found")

    def stop(self, timeout_s: float = 20.0) -> int | None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return None if self.process is None else self.process.returncode

    def __enter__(self) -> "RewardServerProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
