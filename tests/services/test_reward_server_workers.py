"""Reward server start-up: ``--workers 2`` really serves (two processes, in-process scores); every model is built
once (in the process that serves it: the parent with one worker, only the workers with several); bad weights paths
fail in the parent before anything loads; a worker that cannot build stops the server (no restart loop);
``--micro_batch auto`` is on exactly when CUDA is available."""
import json
import math
import os
import subprocess
import sys
import time

import httpx
import pytest
import torch
from PIL import Image

from deepgen_rl.rewards import get_reward
from deepgen_rl.rewards.base import _REGISTRY, Reward, WeightPath
from deepgen_rl.rewards.testing import build_tiny_clip
from deepgen_rl.services.reward import server as server_module
from deepgen_rl.services.reward.launch import RewardServerProcess

FACTORY = "deepgen_rl.services.reward.server:create_app_from_env"
PROMPTS = ["a photo of a cat", "a red car", "green sign", "the blue dog", "a photo", "a bench"]


def imgs(n):
    return [Image.new("RGB", (30 + 2 * i, 36), ((40 * i) % 256, 180, 60 + 10 * i)) for i in range(n)]


def _ppid(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[1])


def test_two_workers_serve_in_process_scores_from_two_processes(tmp_path):
    clip = build_tiny_clip(tmp_path / "clip", logit_scale=math.log(5.0))
    local = get_reward("pickscore", model_name_or_path=clip)(imgs(6), PROMPTS)
    with RewardServerProcess(["pickscore"], {"pickscore": {"model_name_or_path": clip}}, args=["--workers", "2"],
                             env={"REWARD_API_TOKEN": ""}, startup_timeout_s=240) as server:
        remote = get_reward("pickscore", remote_url=server.url, batch_size=1, max_concurrent_requests=6)
        out = remote(imgs(6), PROMPTS)
        assert out.valid.all() and torch.allclose(out.scores, local.scores, atol=1e-5)
        # fresh connections until both workers have answered a score request (the kernel picks the acceptor)
        scored = {}
        deadline = time.monotonic() + 120
        while len([pid for pid, n in scored.items() if n > 0]) < 2 and time.monotonic() < deadline:
            one = get_reward("pickscore", remote_url=server.url, batch_size=1)(imgs(1), PROMPTS[:1])  # new client
            assert one.valid.all() and torch.allclose(one.scores, local.scores[:1], atol=1e-5)
            stats = httpx.get(f"{server.url}/stats", headers={"Connection": "close"}).json()
            scored[stats["pid"]] = stats["images_scored"]
        assert len(scored) == 2 and all(n > 0 for n in scored.values()), scored
        assert all(_ppid(pid) == server.process.pid for pid in scored)  # both are the supervisor's workers


def test_a_worker_that_cannot_build_stops_the_server(tmp_path):
    """The weights path exists (the parent's cheap check passes) but holds no model: every worker fails to build;
    the supervisor exits with uvicorn's STARTUP_FAILURE (3) instead of restarting workers forever."""
    empty = tmp_path / "empty_model"
    empty.mkdir()
    log = tmp_path / "server.log"
    env = {**os.environ, "REWARD_PORT": "0", "REWARD_WORKERS": "2", "HF_HUB_OFFLINE": "1"}
    with open(log, "wb") as out:
        proc = subprocess.run([sys.executable, "-m", "deepgen_rl.services.reward", "--reward", "pickscore",
                               "--reward_kwargs", json.dumps({"pickscore": {"model_name_or_path": str(empty)}})],
                              env=env, stdout=out, stderr=subprocess.STDOUT, timeout=240)
    text = log.read_text()
    assert proc.returncode == 3, text[-2000:]
    assert 1 <= text.count("cannot build its rewards") <= 2, text[-2000:]  # one line per worker, no restarts
    assert "PICKSCORE_MODEL_NAME_OR_PATH" in text and "Traceback" not in text


class CountingReward(Reward):
    """Counts constructions; its weights file is checked by preflight."""

    name = "counting"
    weight_paths = (WeightPath("path", ("COUNTING_WEIGHTS",), "file"),)
    builds = 0

    def __init__(self, path: str | None = None):
        type(self).builds += 1

    def score(self, images, prompts, metadata):
        return torch.ones(len(images)), torch.ones(len(images), dtype=torch.bool), {}


@pytest.fixture
def counting(monkeypatch, tmp_path):
    """Registers ``counting``, captures serve(), keeps main()'s env writes inside the test."""
    monkeypatch.setitem(_REGISTRY, "counting", CountingReward)
    monkeypatch.setattr(CountingReward, "builds", 0)
    for key in ("REWARD_HOST", "REWARD_PORT", "REWARD_WORKERS", "REWARD_THREADS", "REWARD_MAX_BATCH",
                server_module.SPEC_ENV, "COUNTING_WEIGHTS"):
        monkeypatch.delenv(key, raising=False)
    served = []
    monkeypatch.setattr(server_module, "serve", lambda app, config, log_level: served.append((app, config)) or 0)
    weights = tmp_path / "w.pt"
    weights.write_bytes(b"x")
    return served, str(weights)


def test_one_worker_builds_each_reward_once_and_serves_that_app(counting):
    served, weights = counting
    server_module.main(["--reward", "counting", "--reward_kwargs", json.dumps({"counting": {"path": weights}})])
    assert CountingReward.builds == 1
    (app, config), = served
    assert not isinstance(app, str) and config.workers == 1  # the app built here, not a factory to call again


def test_several_workers_build_only_in_the_workers(counting):
    served, weights = counting
    server_module.main(["--reward", "counting", "--workers", "2",
                        "--reward_kwargs", json.dumps({"counting": {"path": weights}})])
    assert CountingReward.builds == 0  # the parent loaded nothing
    (app, config), = served
    assert app == FACTORY and config.workers == 2
    server_module.create_app_from_env()  # what each worker runs
    assert CountingReward.builds == 1


@pytest.mark.parametrize("workers", ["1", "2"])
def test_missing_weights_fail_in_the_parent_before_any_load(counting, capsys, workers):
    served, _ = counting
    with pytest.raises(SystemExit) as exit_info:
        server_module.main(["--reward", "counting", "--workers", workers,
                            "--reward_kwargs", json.dumps({"counting": {"path": "/no/such/weights.pt"}})])
    assert exit_info.value.code == 2 and CountingReward.builds == 0 and served == []
    err = capsys.readouterr().err
    assert err.startswith("deepgen_rl: error: counting: path = '/no/such/weights.pt'") and "$COUNTING_WEIGHTS" in err


def test_a_worker_factory_that_cannot_build_exits_with_startup_failure(monkeypatch):
    class Broken(CountingReward):
        def __init__(self, path=None):
            raise OSError("weights are corrupt")

    monkeypatch.setitem(_REGISTRY, "broken", Broken)
    monkeypatch.setenv(server_module.SPEC_ENV, json.dumps({"rewards": ["broken"], "reward_kwargs": {}, "devices": [],
                                                           "micro_batch": "off"}))
    codes = []

    def fake_exit(code):  # the worker leaves with os._exit (no interpreter shutdown): record it instead
        codes.append(code)
        raise SystemExit(code)

    monkeypatch.setattr(server_module.os, "_exit", fake_exit)
    with pytest.raises(SystemExit):
        server_module.create_app_from_env()
    assert codes == [3]  # uvicorn.config.STARTUP_FAILURE: the supervisor stops, does not restart


@pytest.mark.parametrize("cuda", [True, False])
def test_micro_batch_auto_is_on_exactly_when_cuda_is_available(monkeypatch, cuda):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    assert server_module.micro_batch_enabled("auto") is cuda
    assert server_module.micro_batch_enabled("on") is True and server_module.micro_batch_enabled("off") is False
    seen = []
    monkeypatch.setattr(server_module, "create_app", lambda config, scorers, micro_batch: seen.append(micro_batch))
    server_module.app_from_spec({"rewards": ["brightness"], "reward_kwargs": {}, "devices": [], "micro_batch": "auto"})
    assert seen == [cuda]
    with pytest.raises(ValueError, match="--micro_batch"):
        server_module.micro_batch_enabled("maybe")
