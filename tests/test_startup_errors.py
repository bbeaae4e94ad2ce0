"""Start-up errors (issue 16, items 6-7): every set-up problem ends in ONE ``deepgen_rl: error:`` line naming the flag,
file or field, exit status 2, no traceback, and is found before the model is built."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tests.trainer.helpers import DEMO_PROGRAMMATIC, ROOT, TINY_CONFIG, subprocess_env

BASE = ["--model_config", TINY_CONFIG, "--max_steps", "1", "--rollout_n", "2", "--rollout_micro_batch_size", "4",
        "--atrain_micro_batch_size", "4", "--num_inference_steps", "4", "--image_height", "32", "--image_width", "32",
        "--report_to", "none", "--eval_freq", "0", "--sftaux_coef", "0"]


def _yaml(tmp_path, text, name="m.yaml"):
    (tmp_path / "p.txt").write_text("a red apple\na blue car\n")
    (tmp_path / name).write_text(text)
    return str(tmp_path / name)


def _dataset(tmp_path, rewards="      - brightness: 1.0\n"):
    return _yaml(tmp_path, "datasets:\n  - name: d\n    path: p.txt\n    rewards:\n" + rewards)


CASES = {
    "unknown flag": (lambda t: ["--no_such_flag", "1"], "--no_such_flag"),
    "rollout_n 0": (lambda t: ["--rollout_n", "0"], "--rollout_n"),
    "rollout_n 1": (lambda t: ["--rollout_n", "1"], "--rollout_n"),
    "steps 1": (lambda t: ["--num_inference_steps", "1"], "--num_inference_steps"),
    "height 65": (lambda t: ["--image_height", "65"], "--image_height"),
    "negative eta": (lambda t: ["--sde_eta", "-1"], "--sde_eta"),
    "unknown sampler": (lambda t: ["--atrain_sde_sampler", "euler"], "--atrain_sde_sampler"),
    "nan lr": (lambda t: ["--learning_rate", "nan"], "--learning_rate"),
    "int typo": (lambda t: ["--rollout_n", "four"], "--rollout_n"),
    "dataset yaml syntax": (lambda t: ["--dataset_config", _yaml(t, "datasets: [\n  - name: d\n")], "m.yaml"),
    "reward weight high": (lambda t: ["--dataset_config", _dataset(t, "      - brightness: high\n")],
                           "'brightness' weight must be a number, got 'high'"),
    "unknown reward": (lambda t: ["--dataset_config", _dataset(t, "      - beauty: 1.0\n")], "'beauty'"),
    "missing prompt file": (lambda t: ["--dataset_config", _yaml(t, "datasets:\n  - name: d\n    path: gone.txt\n"
                                                                   "    rewards:\n      - brightness: 1\n")],
                            "gone.txt"),
    "missing eval yaml": (lambda t: ["--eval_dataset_config", str(t / "eval_missing.yaml"), "--eval_freq", "1"],
                          "--eval_dataset_config: eval config not found"),
    "output dir unwritable": (lambda t: ["--output_dir", str(_yaml(t, "x", name="a_file")) + "/out"], "--output_dir"),
    "recipe yaml syntax": (lambda t: ["--config", _yaml(t, "learning_rate: [1e-6\n", name="recipe.yaml")],
                           "--config"),
    "recipe unknown key": (lambda t: ["--config", _yaml(t, "learning_rat: 1.0e-6\n", name="recipe.yaml")],
                           "learning_rat"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_setup_error_is_one_line_before_the_model_is_built(case, tmp_path, monkeypatch, capfd):
    import deepgen_rl.models as models
    from deepgen_rl.grpo_deepgen import main

    def no_model(*a, **k):
        raise AssertionError("the model was built before the set-up error was found")

    monkeypatch.setattr(models, "build_model", no_model)
    monkeypatch.delenv("DEEPGEN_DEBUG", raising=False)
    make, named = CASES[case]
    argv = BASE + ["--dataset_config", DEMO_PROGRAMMATIC, "--output_dir", str(tmp_path / "out")] + make(tmp_path)
    capfd.readouterr()
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = [x for x in capfd.readouterr().err.splitlines() if x.strip() and "WANDB" not in x]
    assert e.value.code == 2
    assert len(err) == 1 and err[0].startswith("deepgen_rl: error: "), err
    assert named in err[0], err[0]


# Time from launch to the error line, measured on a 2-core CPU machine shared with other jobs (load 2.3-3.4): 10.1,
# 10.7 and 18.8 s, of which importing the entry module (torch, transformers, peft via trl) alone took 10.7-11.3 s; the
# model is never built. The bound is ~4x the typical 10-11 s, a margin for slower CI machines, not a benchmark.
TIME_TO_ERROR_BOUND_S = 45.0


@pytest.mark.serial  # a wall-clock bound: run alone (scripts/test.sh)
def test_time_to_error_line_in_a_fresh_process(tmp_path):
    """A missing eval YAML is reported in a fresh process without loading the model: one line, no traceback, within
    TIME_TO_ERROR_BOUND_S (about the cost of importing torch and transformers). The tiny model's cache is empty, as
    on a fresh clone: the check must not build the tiny model first (CI's clean clone once did, printing its
    progress bars before the error line)."""
    argv = BASE + ["--dataset_config", DEMO_PROGRAMMATIC, "--output_dir", str(tmp_path / "out"),
                   "--eval_dataset_config", str(tmp_path / "eval_missing.yaml"), "--eval_freq", "1"]
    empty_cache = tmp_path / "tiny_cache"
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "deepgen_rl.grpo_deepgen", *argv], cwd=ROOT,
                          env=subprocess_env(DEEPGEN_TINY_DIR=empty_cache), capture_output=True, text=True, timeout=300)
    elapsed = time.monotonic() - t0
    print(f"time to the error line: {elapsed:.2f} s")
    err = [x for x in proc.stderr.splitlines() if x.strip() and "WANDB" not in x]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert len(err) == 1 and err[0].startswith("deepgen_rl: error: --eval_dataset_config"), proc.stderr
    assert "eval_missing.yaml" in err[0]
    assert "loaded" not in proc.stderr  # no checkpoint was loaded: the model was never built
    assert not empty_cache.exists()  # nor were the tiny model's files
    assert elapsed < TIME_TO_ERROR_BOUND_S, f"{elapsed:.1f} s to the error line (bound {TIME_TO_ERROR_BOUND_S} s)"


def test_offload_without_a_buildable_cpu_adam_fails_before_the_model_is_built(tmp_path, monkeypatch, capfd):
    """zero3_offload on a GPU node whose DeepSpeed lacks a prebuilt CPU Adam and whose CUDA toolkit is missing (the
    conditions mocked as in tests/trainer/test_gpu_checks.py): one line naming --deepspeed and CUDA_HOME, from the
    entry point's pre-build check, not after the model is built (issue 18, item 9)."""
    import deepspeed.git_version_info as gvi
    import torch
    from torch.utils import cpp_extension

    import deepgen_rl.grpo_deepgen as entry
    import deepgen_rl.models as models

    offload = str(ROOT / "scripts/deepspeed/zero3_offload.json")
    argv = BASE + ["--dataset_config", DEMO_PROGRAMMATIC, "--output_dir", str(tmp_path / "out"), "--deepspeed", offload]
    parsed = {"offload": entry.parse_args(argv),  # parsed on the real (CPU) machine: TrainingArguments would
              "zero2": entry.parse_args(argv[:-1] + [str(ROOT / "scripts/deepspeed/zero2.json")])}  # pick a GPU
    built = []
    monkeypatch.setattr(models, "build_model", lambda *a, **k: built.append(1))
    monkeypatch.setattr(entry, "parse_args", lambda argv: parsed["offload"])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    monkeypatch.setattr(gvi, "installed_ops", {"cpu_adam": False})
    monkeypatch.setattr(cpp_extension, "CUDA_HOME", None)
    monkeypatch.delenv("DEEPGEN_DEBUG", raising=False)
    capfd.readouterr()
    with pytest.raises(SystemExit) as e:
        entry.main(argv)
    err = [x for x in capfd.readouterr().err.splitlines() if x.strip() and "WANDB" not in x]
    assert e.value.code == 2 and built == []
    assert len(err) == 1 and err[0].startswith(f"deepgen_rl: error: --deepspeed {offload}: "), err
    assert "CUDA_HOME is unset" in err[0] and "DS_BUILD_CPU_ADAM=1" in err[0]

    # the same machine with the op prebuilt, or a config without optimizer offload, passes the check
    entry.preflight(*parsed["zero2"])
    monkeypatch.setattr(gvi, "installed_ops", {"cpu_adam": True})
    entry.preflight(*parsed["offload"])


def test_model_config_check_builds_no_model_files(tmp_path, monkeypatch):
    """The start-up check of a tiny-preset config reads the config only; `build_model` makes the files."""
    from deepgen_rl.models.build import check_model_config

    monkeypatch.setenv("DEEPGEN_TINY_DIR", str(tmp_path / "tiny"))
    cfg = check_model_config(TINY_CONFIG)
    assert not (tmp_path / "tiny").exists()
    assert cfg["tiny_preset"] == "tiny" and "{tiny_dir}" in cfg["lmm_path"]


def test_model_config_check_names_a_prebuilt_builder_that_does_not_exist(tmp_path):
    from deepgen_rl.models.build import check_model_config

    cfg = tmp_path / "m.py"
    cfg.write_text("prebuilt = 'deepgen_rl.toy.model:no_such_builder'\nlmm_path = '{prebuilt_dir}/qwen'\n"
                   "sd3_path = '{prebuilt_dir}/sd3'\n")
    with pytest.raises(ValueError, match="prebuilt 'deepgen_rl.toy.model:no_such_builder' cannot be imported"):
        check_model_config(str(cfg))
