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
