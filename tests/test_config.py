"""Arguments: seed defaults, booleans switch both ways, batch validation with readable messages."""

from __future__ import annotations

import pytest
from transformers import HfArgumentParser

from deepgen_rl.config import DataArguments, GRPOConfig, ModelArguments, batch_layout
from deepgen_rl.grpo_deepgen import parse_args


def parse(*argv):
    """The entry point's parser: argparse errors (a value outside a field's "choices") raise a one-line
    ``SetupError`` (a ValueError) there instead of exiting."""
    return parse_args(list(argv))


def test_plain_hf_parser_builds_the_same_arguments():
    assert HfArgumentParser((ModelArguments, DataArguments, GRPOConfig)).parse_args_into_dataclasses(
        args=["--rollout_n", "4"])[2].rollout_n == parse("--rollout_n", "4")[2].rollout_n == 4


def test_seed_defaults():
    _, _, a = parse()
    assert a.learning_rate == 2e-6 and a.rollout_n == 8 and a.rollout_micro_batch_size == 32
    assert a.atrain_micro_batch_size == 32 and a.atrain_sde_sampler == "cps_sde" and a.atrain_adv_type == "gdpo"
    assert a.beta == 5e-7 and a.atrain_kl_type == "v-based" and a.num_inference_steps == 50
    assert (a.image_height, a.image_width) == (512, 512) and a.timestep_fraction == 0.6 and a.clip_range == 1e-4
    assert a.sftaux_coef == 1e-4 and a.eval_freq == 10 and a.gradient_checkpointing is True
    assert a.cfg_scale == 0.0
    assert str(getattr(a.lr_scheduler_type, "value", a.lr_scheduler_type)) == "constant_with_warmup"


@pytest.mark.parametrize("flag", ["gradient_checkpointing", "init_same_noise", "eval_judge", "auto_resume",
                                  "negate_advantages", "save_rollout_records", "eval_at_start"])
def test_booleans_switch_both_ways(flag):
    assert getattr(parse(f"--{flag}", "true")[2], flag) is True
    assert getattr(parse(f"--{flag}", "false")[2], flag) is False


def test_deepspeed_path_is_kept_for_the_trainer():
    _, _, a = parse("--deepspeed", "scripts/deepspeed/zero2.json")
    assert a.deepspeed_config == "scripts/deepspeed/zero2.json" and a.deepspeed is None


@pytest.mark.parametrize("world", [1, 8, 16, 32])
def test_default_layout_valid_for_1_2_4_nodes(world):
    _, _, a = parse()
    lay = batch_layout(a, world)
    assert lay["images_per_rank"] == 32 and lay["prompts_per_rank"] == 4
    assert lay["global_images"] == 32 * world and lay["global_prompts"] == 4 * world


def test_invalid_layout_message_shows_counts():
    _, _, a = parse("--rollout_global_batch_size", "20")
    with pytest.raises(ValueError) as e:
        batch_layout(a, 2)
    msg = str(e.value)
    assert "ranks=2" in msg and "20 images" in msg and "per rank: 10 images = 1.25 prompts" in msg


def test_reuse_last_velocity_switches_with_a_window():
    assert parse("--reuse_last_velocity", "true", "--sde_window_size", "1")[2].reuse_last_velocity is True
    assert parse("--reuse_last_velocity", "false")[2].reuse_last_velocity is False


def test_skip_zero_advantage_switches_with_beta_0():
    assert parse("--skip_zero_advantage", "true", "--beta", "0")[2].skip_zero_advantage is True
    assert parse("--skip_zero_advantage", "false")[2].skip_zero_advantage is False


@pytest.mark.parametrize("argv,needle", [
    (("--atrain_sde_sampler", "euler"), "atrain_sde_sampler"),
    (("--atrain_adv_type", "ppo"), "atrain_adv_type"),
    (("--timestep_fraction", "0"), "timestep_fraction"),
    (("--reward_kwargs", "{bad"), "reward_kwargs"),
    (("--atrain_algorithm", "diffusionnft", "--atrain_num_actor_update_steps", "2"), "atrain_num_actor_update_steps"),
    (("--image_height", "100"), "multiples of 16"),
    (("--sde_eta", "-1", "--atrain_sde_sampler", "flowgrpo_sde"), "eta must be a finite number >= 0"),
    (("--sde_eta", "2"), "cps_sde: eta must be in"),
    (("--clip_range", "-0.5"), "clip_range"),
    (("--adv_clip_max", "0"), "adv_clip_max"),
    (("--sde_window_range", "5"), "lo,hi"),
    (("--sde_window_size", "3", "--sde_window_range", "40,10"), "does not fit"),
    (("--reuse_last_velocity", "true"), "reuse_last_velocity needs an SDE window"),
    (("--skip_zero_advantage", "true"), "skip_zero_advantage needs --beta 0"),  # the recipe's beta is 5e-7
    (("--skip_zero_advantage", "true", "--beta", "0", "--atrain_algorithm", "diffusionnft"), "DiffusionNFT"),
    (("--skip_zero_advantage", "true", "--beta", "0", "--zero_advantage_tol", "0.5"), "zero_advantage_tol"),
])
def test_invalid_arguments_fail_at_start(argv, needle):
    with pytest.raises(ValueError, match=needle):
        parse(*argv)
