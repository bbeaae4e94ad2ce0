"""``--config configs/train/deepgen_rl.yaml`` (TRL's TrlParser): the recipe lives in one YAML, flags override it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from deepgen_rl.grpo_deepgen import SetupError, parse_args

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "configs/train/deepgen_rl.yaml"

# The recipe (the original DeepGen-RL code's defaults, docs/recipe.md "Flags of grpo_deepgen.py"), written out
# independently
RECIPE_VALUES = {
    "learning_rate": 2e-6, "rollout_n": 8, "rollout_micro_batch_size": 32, "atrain_micro_batch_size": 32,
    "atrain_sde_sampler": "cps_sde", "atrain_adv_type": "gdpo", "beta": 5e-7, "atrain_kl_type": "v-based",
    "num_inference_steps": 50, "image_height": 512, "image_width": 512, "timestep_fraction": 0.6,
    "clip_range": 1e-4, "sftaux_coef": 1e-4, "eval_freq": 10, "gradient_checkpointing": True,
    "num_train_epochs": 10, "cfg_scale": 0.0, "sde_eta": 1.0, "init_same_noise": True, "warmup_steps": 20,
    "sftaux_micro_batch_size": 32, "diffusionnft_beta": 0.1, "log_images_every": 1,
}


def test_recipe_yaml_sets_the_recipe_values():
    model_args, data_args, args = parse_args(["--config", str(RECIPE), "--output_dir", "unused"])
    for key, want in RECIPE_VALUES.items():
        assert getattr(args, key) == want, key
    assert getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type) == "constant_with_warmup"
    assert args.report_to == ["wandb", "swanlab"]
    assert model_args.model_config == "configs/models/deepgen_sd35m_qwen25vl3b.py"
    assert data_args.dataset_config == "assets/rl_datasets/deepgen/deepgen_train.yaml"
    assert set(yaml.safe_load(RECIPE.read_text())) >= set(RECIPE_VALUES)


def test_command_line_flags_override_the_recipe():
    _, data_args, args = parse_args(["--config", str(RECIPE), "--learning_rate", "1e-5", "--rollout_n", "4",
                                     "--init_same_noise", "false", "--dataset_config", "mine.yaml"])
    assert args.learning_rate == 1e-5 and args.rollout_n == 4 and args.init_same_noise is False
    assert data_args.dataset_config == "mine.yaml"
    assert args.sde_eta == 1.0 and args.warmup_steps == 20  # the rest still comes from the file


@pytest.mark.parametrize("text,words", [("rollout_n: [8\n", "not valid YAML at line"),
                                        ("rollout_nn: 8\n", "unknown key(s) ['rollout_nn']"),
                                        ("- 1\n- 2\n", "expected a mapping"),
                                        ("rollout_n: eight\n", "rollout_n"),
                                        ("rollout_n: 0\n", "--rollout_n must be >= 1")])
def test_recipe_errors_name_the_file(tmp_path, text, words):
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    with pytest.raises(SetupError) as e:
        parse_args(["--config", str(bad)])
    assert str(bad) in str(e.value) and words in str(e.value)
