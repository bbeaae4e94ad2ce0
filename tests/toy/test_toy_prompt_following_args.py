"""scripts/toy_prompt_following.sh refuses a bad setting in one line naming it, before it builds or writes anything
(the headline run itself: tests/toy/test_toy_prompt_following.py, opt-in)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name, value, expected", [
    ("TOY_VARIANT", "slots_tall", "TOY_VARIANT must be a toy variant, one of default,"),
    ("TOY_STEPS", "12x", "TOY_STEPS must be a non-negative integer, got '12x'"),
    ("TOY_MINUTES", "14min", "TOY_MINUTES must be a non-negative number (0 = no budget), got '14min'"),
    ("TOY_MINUTES", "-3", "TOY_MINUTES must be a non-negative number (0 = no budget), got '-3'"),
])
def test_a_bad_setting_is_one_line_naming_it_and_nothing_is_written(tmp_path, name, value, expected):
    out = tmp_path / "run"
    env = dict(os.environ, TOY_OUTPUT_DIR=str(out), **{name: value})
    proc = subprocess.run(["bash", "scripts/toy_prompt_following.sh"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode != 0
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and expected in err[0] and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert not out.exists()


def test_the_script_passes_the_flags_the_ci_test_runs():
    """tests/toy/test_toy_rl.py runs the script's setting in process from `PROMPT_FOLLOWING_FLAGS`: every constant
    flag the script gives the trainer has the same value there, and every flag there is given by the script (the
    run-specific ones, set from TOY_* variables, are the script's alone)."""
    import json
    import shlex

    from deepgen_rl.toy.rl_run import PROMPT_FOLLOWING_FLAGS, TOY_HELDOUT_EVAL_YAML, TOY_RL_MIX_YAML

    text = (ROOT / "scripts/toy_prompt_following.sh").read_text()
    call = text[text.index("bash scripts/train.sh --"):]
    call = call[:call.index('"$@"')].replace("\\\n", " ")
    tokens = shlex.split(call, posix=True)[2:]
    given = dict(zip(tokens[::2], tokens[1::2]))
    assert all(k.startswith("--") for k in given), tokens
    run_specific = {k for k, v in given.items() if "$" in v}  # shlex keeps "$STEPS" as it is
    assert run_specific == {"--eval_freq", "--max_steps", "--save_steps", "--max_train_minutes",
                            "--max_train_minutes_from", "--seed"}

    def same(value, expected):
        if isinstance(expected, bool):
            return value == str(expected).lower()
        if isinstance(expected, dict):
            return json.loads(value) == expected
        if isinstance(expected, (int, float)):
            return float(value) == expected
        return value == expected

    constant = {k[2:]: v for k, v in given.items() if k not in run_specific}
    assert constant.keys() == PROMPT_FOLLOWING_FLAGS.keys()
    assert {k: v for k, v in constant.items() if not same(v, PROMPT_FOLLOWING_FLAGS[k])} == {}
    assert f"DATASET_CONFIG={Path(TOY_RL_MIX_YAML).relative_to(ROOT)} " in text
    assert f"EVAL_DATASET_CONFIG={Path(TOY_HELDOUT_EVAL_YAML).relative_to(ROOT)} " in text
