"""The prompt-length limit (issue 12, item 2): one value in the real model config, the model's default, the fallback
of ``build_from_config`` and the limit bench/prompt_rows.py and docs/recipe.md measured against; a prompt over it is
truncated, counted and logged as a warning."""

from __future__ import annotations

import copy
import importlib.util
import logging
import re

from mmengine.config import Config

from deepgen_rl.models.assemble import build_from_config
from deepgen_rl.models.build import _config_dict
from deepgen_rl.models.deepgen.model import DEFAULT_MAX_PROMPT_TOKENS, DeepGen
from tests.models.paths import REAL_CONFIG, REPO, TINY_CONFIG


def _bench_limits() -> tuple[int, int]:
    spec = importlib.util.spec_from_file_location("prompt_rows_bench", REPO / "bench/prompt_rows.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # module level only defines constants and functions (main() is not run)
    return mod.OLD_LIMIT, mod.NEW_LIMIT


def test_real_config_limit_is_the_measured_limit_and_the_model_default():
    real = Config.fromfile(REAL_CONFIG, lazy_import=False).to_dict()["max_prompt_tokens"]
    old, new = _bench_limits()
    assert real == new == DEFAULT_MAX_PROMPT_TOKENS == 1024, (real, new, DEFAULT_MAX_PROMPT_TOKENS)
    assert old == 256 and real > old  # reverting the config to the old 256 fails here
    doc = (REPO / "docs/recipe.md").read_text()
    assert f"sets `max_prompt_tokens = {real}`" in doc and f"over {new}" in doc
    # the longest measured recipe prompt (upper estimate, docs/recipe.md) fits the limit
    longest_upper = max(int(m) for m in re.findall(r"\| \d+ / \d+ / (\d+) \|", doc))
    assert longest_upper == 663 and longest_upper < real


def test_a_config_without_max_prompt_tokens_gets_the_model_default():
    cfg = _config_dict(TINY_CONFIG, {})
    assert cfg.pop("max_prompt_tokens") == 64  # the tiny config sets its own
    model = build_from_config(cfg)
    assert model.max_prompt_tokens == DEFAULT_MAX_PROMPT_TOKENS
    import inspect

    assert inspect.signature(DeepGen).parameters["max_prompt_tokens"].default == DEFAULT_MAX_PROMPT_TOKENS


def test_truncation_is_counted_and_logged_as_a_warning(tiny_model, caplog):
    m = copy.copy(tiny_model)  # shallow: own counter, shared weights
    m.num_truncated_prompts = 0
    limit = m.max_prompt_tokens
    very_long = " ".join(["a red apple on a wooden table"] * 30)
    name = "deepgen_rl.models.deepgen.model"
    with caplog.at_level(logging.WARNING, logger=name):
        m.encode_prompts(["a cat", "a dog"])
    assert [r for r in caplog.records if r.name == name] == []  # short prompts: no warning
    with caplog.at_level(logging.WARNING, logger=name):
        cond = m.encode_prompts(["a cat", very_long, very_long])
        m.encode_prompts([very_long])
    records = [r for r in caplog.records if r.name == name]
    assert [r.levelno for r in records] == [logging.WARNING, logging.WARNING]
    assert [r.getMessage() for r in records] == [
        f"truncated 2 prompt(s) to max_prompt_tokens={limit} (2 so far)",
        f"truncated 1 prompt(s) to max_prompt_tokens={limit} (3 so far)"]
    assert m.num_truncated_prompts == 3
    assert int(cond.text_mask[1].sum()) == limit + m.num_queries  # cut to the limit, plus the think tokens

