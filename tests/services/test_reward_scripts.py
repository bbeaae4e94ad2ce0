"""scripts/reward_unifiedreward.sh --dry-run command lines (dp/tp) and scripts/reward_ocr.sh wiring."""
import os
import shlex
import subprocess
from pathlib import Path

import pytest

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
