"""Each option list has one home in ``deepgen_rl/rl``; the flag table of docs/training.md and ``--help`` show exactly
that list (and the config's default), so a sampler, advantage type, KL form or algorithm added in code cannot be
missing from either, nor a removed one linger."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from deepgen_rl.config import GRPOConfig
from deepgen_rl.rl.advantages import ADV_TYPES
from deepgen_rl.rl.losses import KL_TYPES
from deepgen_rl.rl.objectives import OBJECTIVE_NAMES
from deepgen_rl.rl.samplers import SDE_SAMPLERS

ROOT = Path(__file__).resolve().parents[1]
TRAINING_DOC = ROOT / "docs/training.md"
# flag -> (the imported tuple, its name and home as the doc cites them)
OPTION_LISTS = {
    "atrain_sde_sampler": (SDE_SAMPLERS, "SDE_SAMPLERS", "deepgen_rl/rl/samplers.py"),
    "atrain_adv_type": (ADV_TYPES, "ADV_TYPES", "deepgen_rl/rl/advantages.py"),
    "atrain_kl_type": (KL_TYPES, "KL_TYPES", "deepgen_rl/rl/losses.py"),
    "atrain_algorithm": (OBJECTIVE_NAMES, "OBJECTIVES", "deepgen_rl/rl/objectives.py"),
}
DEFAULTS = {f.name: f.default for f in dataclasses.fields(GRPOConfig)}


def doc_row(flag: str) -> tuple[str, list[str]]:
    """The default and the listed names of ``flag``'s row in the flag tables of docs/training.md."""
    rows = [ln for ln in TRAINING_DOC.read_text().splitlines()
            if ln.startswith(f"| `--{flag}` | `") and ln.count("|") == 4]  # | flag | default | meaning |
    assert len(rows) == 1, f"docs/training.md needs exactly one flag-table row for --{flag}, found {len(rows)}"
    _, default, meaning = [c.strip() for c in rows[0].strip("|").split("|")]
    tuple_name, home = OPTION_LISTS[flag][1:]
    m = re.match(rf"one of `{tuple_name}` \(`{re.escape(home)}`\): (.*)$", meaning)
    assert m, f"--{flag}'s row should read 'one of `{tuple_name}` (`{home}`): `a`, `b`, ...', got {meaning!r}"
    return default.strip("`"), re.findall(r"`([^`]+)`", m.group(1))


@pytest.mark.parametrize("flag", OPTION_LISTS)
def test_training_doc_lists_exactly_the_code_choices_and_default(flag):
    default, names = doc_row(flag)
    assert tuple(names) == OPTION_LISTS[flag][0], f"docs/training.md --{flag}: {names} != {OPTION_LISTS[flag][0]}"
    assert default == DEFAULTS[flag]


@pytest.fixture(scope="module")
def help_text() -> str:
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", COLUMNS="400")  # no wrapped option lines
    proc = subprocess.run([sys.executable, "-m", "deepgen_rl.grpo_deepgen", "--help"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.parametrize("flag", OPTION_LISTS)
def test_help_lists_exactly_the_code_choices_and_default(help_text, flag):
    # the options section: "  --flag {a,b,c}, --flag-with-dashes {a,b,c}" then its help lines, "(default: x)"
    lines = help_text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith(f"  --{flag} {{")), None)
    assert start is not None, f"--help shows no choices for --{flag}"
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("  -")), len(lines))
    choices = re.match(rf"  --{flag} \{{([^}}]*)\}}", lines[start]).group(1).split(",")
    assert tuple(choices) == OPTION_LISTS[flag][0]
    assert f"(default: {DEFAULTS[flag]})" in " ".join(ln.strip() for ln in lines[start:end])
