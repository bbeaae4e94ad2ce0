"""README's sentence "All other defaults are the recipe's: …" states the flags' real defaults (it once said η 0.7
after the default had become the recipe's 1.0)."""

from __future__ import annotations

import re
from pathlib import Path

from transformers import HfArgumentParser

from deepgen_rl.config import GRPOConfig

ROOT = Path(__file__).resolve().parents[1]


def _readme_sentence() -> str:
    text = " ".join((ROOT / "README.md").read_text().split())
    start = text.index("All other defaults are the recipe's:")
    return text[start:text.index("(`tests/test_readme_defaults.py`", start)]


def test_readme_default_sentence_matches_the_flag_defaults(tmp_path):
    (args,) = HfArgumentParser((GRPOConfig,)).parse_args_into_dataclasses(args=["--output_dir", str(tmp_path)])
    s = _readme_sentence()

    def num(pattern: str) -> float:
        m = re.search(pattern, s)
        assert m, f"README no longer states {pattern!r}: {s}"
        return float(m.group(1))

    assert num(r"learning rate (\S+) ") == args.learning_rate
    assert num(r"with (\d+) warm-up updates") == args.warmup_steps
    assert num(r"`rollout_n` (\d+)") == args.rollout_n
    assert num(r"micro-batches of (\d+) images") == args.rollout_micro_batch_size == args.atrain_micro_batch_size
    assert re.search(r"`(\w+)` sampler", s).group(1) == args.atrain_sde_sampler
    assert num(r"sampler with η ([\d.]+)") == args.sde_eta
    assert ("same noise" in s) == args.init_same_noise
    assert re.search(r"`(\w+)` advantages", s).group(1) == args.atrain_adv_type
    assert num(r"KL β (\S+) ") == args.beta and f"({args.atrain_kl_type})" in s
    assert num(r"(\d+) denoising steps") == args.num_inference_steps
    assert tuple(int(x) for x in re.search(r"at (\d+)×(\d+)", s).groups()) == (args.image_height, args.image_width)
    assert num(r"(\d+) % of the timesteps") / 100 == args.timestep_fraction
    assert num(r"clip range (\S+),") == args.clip_range
    assert num(r"SFT-auxiliary coefficient (\S+),") == args.sftaux_coef
    assert num(r"evaluation every (\d+) steps") == args.eval_freq
    assert ("a sample grid every step" in s) == (args.log_images_every == 1)
    assert ("gradient checkpointing on" in s) == bool(args.gradient_checkpointing)
