"""scripts/reward_unifiedreward.sh --dry-run command lines (dp/tp), and scripts/reward_ocr.sh started for real."""
import os
import shlex
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from deepgen_rl.services.ocr.launch import free_port

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "reward_unifiedreward.sh"


def run(env, *args):
    base = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "UNIFIEDREWARD_", "REWARD_API"))}
    base["PATH"] = "/usr/bin:/bin"  # no vllm, no nvidia-smi
    return subprocess.run(["bash", str(SCRIPT), *args], env={**base, **env}, capture_output=True, text=True,
                          timeout=30)


def argv(env, *args):
    result = run(env, "--dry-run", *args)
    assert result.returncode == 0, result.stderr
    return shlex.split(result.stdout.strip())


def option(args, name):
    return args[args.index(name) + 1]


def test_dry_run_default_is_dp_on_port_18087():
    args = argv({})
    assert args[:3] == ["vllm", "serve", "CodeGoat24/UnifiedReward-Think-qwen3vl-8b"]
    assert option(args, "--host") == "127.0.0.1" and option(args, "--port") == "18087"
    assert option(args, "--served-model-name") == "UnifiedReward"
    assert option(args, "--data-parallel-size") == "1" and option(args, "--tensor-parallel-size") == "1"
    assert "--api-key" not in args


def test_dry_run_dp_uses_visible_gpus_and_overrides():
    args = argv({"CUDA_VISIBLE_DEVICES": "0,1,2,3", "UNIFIEDREWARD_PORT": "19000", "UNIFIEDREWARD_HOST": "0.0.0.0",
                 "UNIFIEDREWARD_MODEL": "/models/urt", "UNIFIEDREWARD_MODEL_NAME": "Judge"}, "--enforce-eager")
    assert args[2] == "/models/urt" and option(args, "--served-model-name") == "Judge"
    assert option(args, "--port") == "19000" and option(args, "--host") == "0.0.0.0"
    assert option(args, "--data-parallel-size") == "4" and option(args, "--tensor-parallel-size") == "1"
    assert args[-1] == "--enforce-eager"
    assert option(argv({"CUDA_VISIBLE_DEVICES": "0,1,2,3", "VLLM_DATA_PARALLEL_SIZE": "2"}),
                  "--data-parallel-size") == "2"


def test_dry_run_tp():
    args = argv({"VLLM_PARALLEL_MODE": "tp", "CUDA_VISIBLE_DEVICES": "0,1"})
    assert option(args, "--tensor-parallel-size") == "2" and option(args, "--data-parallel-size") == "1"
    args = argv({"VLLM_PARALLEL_MODE": "tp", "VLLM_TENSOR_PARALLEL_SIZE": "8"})
    assert option(args, "--tensor-parallel-size") == "8"


def test_dry_run_hides_token_value():
    result = run({"REWARD_API_TOKEN": "s3cret"}, "--dry-run")
    assert result.returncode == 0 and "s3cret" not in result.stdout and '--api-key "$REWARD_API_TOKEN"' in result.stdout


@pytest.mark.parametrize("env, code, message", [({}, 127, "vllm' is not installed"),
                                                ({"VLLM_PARALLEL_MODE": "pp"}, 2, "dp or tp")])
def test_errors(env, code, message):
    result = run(env)
    assert result.returncode == code and message in result.stderr


def test_reward_ocr_script_runs_the_service_module():
    text = (ROOT / "scripts" / "reward_ocr.sh").read_text()
    assert "python -m deepgen_rl.services.ocr.app" in text and "OCR_PORT:-18082" in text
    assert subprocess.run(["bash", "-n", str(ROOT / "scripts" / "reward_ocr.sh")]).returncode == 0


def _connects(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=2):
            return True
    except OSError:
        return False


def _other_local_addresses() -> list[str]:
    """Another loopback address: Linux routes all of 127/8 to lo, but a socket bound to 127.0.0.1 does not accept
    127.0.0.2 while a wildcard (0.0.0.0) bind does. Only loopback addresses are ever contacted by tests."""
    return ["127.0.0.2"]


def _start_ocr_script(tmp_path, port, host=None):
    env = {k: v for k, v in os.environ.items() if k not in ("OCR_HOST", "REWARD_API_TOKEN")}
    env.update({"OCR_PORT": str(port), "OCR_THREADS": "1", "OCR_ORT_THREADS": "1"})
    if host is not None:
        env["OCR_HOST"] = host
    log_path = tmp_path / f"reward_ocr_{port}.log"
    log = open(log_path, "wb")
    process = subprocess.Popen(["bash", str(ROOT / "scripts" / "reward_ocr.sh")], cwd=tmp_path, env=env, stdout=log,
                               stderr=subprocess.STDOUT, start_new_session=True)
    log.close()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert process.poll() is None, f"reward_ocr.sh exited with {process.returncode}: {log_path.read_text()}"
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).json()["status"] == "ok":
                return process, log_path
        except (httpx.TransportError, ValueError):
            pass
        time.sleep(0.2)
    _stop(process)
    pytest.fail(f"reward_ocr.sh did not answer /health on 127.0.0.1:{port}: {log_path.read_text()}")


def _stop(process) -> int:
    """SIGTERM the script's whole process group; return its exit code (the group must be gone)."""
    pgid = os.getpgid(process.pid)
    os.killpg(pgid, signal.SIGTERM)
    try:
        code = process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(pgid, signal.SIGKILL)
        process.wait()
        raise
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return code
        time.sleep(0.1)
    os.killpg(pgid, signal.SIGKILL)
    raise AssertionError(f"process group {pgid} still alive after SIGTERM")


def test_reward_ocr_script_serves_on_loopback_only_by_default(tmp_path):
    """``bash scripts/reward_ocr.sh`` without OCR_HOST: answers on 127.0.0.1:OCR_PORT and nowhere else."""
    port = free_port()
    process, log_path = _start_ocr_script(tmp_path, port)
    try:
        health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).json()
        assert health["pid"] == process.pid  # the script execs the service: same process
        for address in _other_local_addresses():
            assert not _connects(address, port), f"service reachable on {address}:{port}: not bound to 127.0.0.1 only"
        log = log_path.read_text()
        assert f"OCR reward service on http://127.0.0.1:{port}" in log
        assert f"Uvicorn running on http://127.0.0.1:{port}" in log
    finally:
        code = _stop(process)
    assert code in (0, -signal.SIGTERM), code
    assert not _connects("127.0.0.1", port)


def test_other_address_check_detects_a_wildcard_bind(tmp_path):
    """Control for the test above: with OCR_HOST=0.0.0.0 the other local addresses do connect."""
    port = free_port()
    process, _ = _start_ocr_script(tmp_path, port, host="0.0.0.0")
    try:
        assert all(_connects(address, port) for address in _other_local_addresses())
    finally:
        _stop(process)


def test_reward_server_script_runs_the_server_module():
    text = (ROOT / "scripts" / "reward_server.sh").read_text()
    assert "exec python -m deepgen_rl.services.reward" in text and "REWARD_PORT:-18090" in text
    assert "REWARD_HOST:-127.0.0.1" in text
    assert subprocess.run(["bash", "-n", str(ROOT / "scripts" / "reward_server.sh")]).returncode == 0


def test_reward_server_rejects_unknown_rewards_and_kwargs():
    import sys

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for args, message in ((["--reward", "no_such_reward"], "not registered"),
                          (["--reward", "brightness", "--reward_kwargs", '{"ocr": {}}'], "not served"),
                          (["--reward", "brightness", "--reward_kwargs", "{bad"], "not valid JSON")):
        result = subprocess.run([sys.executable, "-m", "deepgen_rl.services.reward", *args], env=env,
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 2 and message in result.stderr, (args, result.stderr[-500:])
