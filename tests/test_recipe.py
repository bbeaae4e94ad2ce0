"""docs/recipe.md pins our defaults: every "ours" value is the dataclass (or train.sh) default, every difference
links its reason, the recipe values are equal, and the KL-scale table is what the sampler and kl_penalty give."""

from __future__ import annotations

import dataclasses
import math
import re
import sys
from pathlib import Path

import pytest
import torch

from deepgen_rl.config import DataArguments, GRPOConfig, ModelArguments
from deepgen_rl.rl.losses import kl_penalty
from deepgen_rl.rl.samplers import make_sigmas, sde_step

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs/recipe.md").read_text()
sys.path.insert(0, str(ROOT / "scripts/utils"))
from kl_scale_table import kl_scale_rows, markdown  # noqa: E402

FIELDS = {f.name: f for cls in (ModelArguments, DataArguments, GRPOConfig) for f in dataclasses.fields(cls)}
# the recipe values this project once differed on (original flag -> must equal ours)
RECIPE = ("--sde_eta", "--init_same_noise", "--warmup_steps", "--sftaux_micro_batch_size", "--atrain_nft_beta",
          "--log_images_interval", "--bf16")


def _section(title: str) -> str:
    start = DOC.index(title)
    end = DOC.find("\n## ", start + 1)
    return DOC[start:end if end > 0 else None]


def _rows(section: str) -> list[list[str]]:
    rows = []
    for line in section.splitlines():
        if line.startswith("| `--"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            assert len(cells) == 5, line
            rows.append(cells)
    return rows


def _value(cell: str) -> str:
    return cell.strip().strip("`")


def _same(a: str, b: str) -> bool:
    try:
        return math.isclose(float(a), float(b), rel_tol=1e-12)
    except ValueError:
        return a.lower() == b.lower()


def _matches_default(text: str, default) -> bool:
    if default is None:
        return text == "none"
    if isinstance(default, bool):
        return text == str(default).lower()
    if isinstance(default, (int, float)):
        return float(text) == float(default)
    return text == str(getattr(default, "value", default))


def _anchors() -> set[str]:
    heads = re.findall(r"^#+ (.+)$", DOC, re.M)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in heads}


def test_every_ours_value_is_our_default():
    rows = _rows(_section("## Flags of `grpo_deepgen.py`"))
    assert len(rows) >= 60
    checked = 0
    for orig_flag, _, our_flag, our_default, _ in rows:
        if our_flag == "—":
            continue
        name = _value(our_flag)[2:]
        assert name in FIELDS, f"{our_flag} is not an argument of deepgen_rl/config.py"
        f = FIELDS[name]
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        assert _matches_default(_value(our_default), default), (
            f"docs/recipe.md says {our_flag} defaults to {our_default}, config.py has {default!r}: update one")
        checked += 1
    assert checked >= 45


def test_every_difference_links_its_reason_and_the_recipe_values_are_equal():
    anchors = _anchors()
    rows = _rows(_section("## Flags of `grpo_deepgen.py`"))
    by_flag = {_value(r[0]): r for r in rows}
    for orig_flag, orig, our_flag, ours, note in rows:
        if our_flag != "—" and not _same(_value(orig), _value(ours)) and "same meaning" not in note:
            links = re.findall(r"\]\(#([^)]+)\)", note)
            assert links and all(a in anchors for a in links), f"{orig_flag}: {orig} vs {ours} needs a reason link"
    for flag in RECIPE[:-1]:
        _, orig, _, ours, _ = by_flag[flag]
        assert _same(_value(orig), _value(ours)), f"{flag}: ours {ours} is not the recipe's {orig}"
    for name, value in [("sde_eta", 1.0), ("init_same_noise", True), ("warmup_steps", 20),
                        ("sftaux_micro_batch_size", 32), ("diffusionnft_beta", 0.1), ("log_images_every", 1)]:
        assert FIELDS[name].default == value, name


def test_train_sh_sets_the_rows_of_its_table():
    text = (ROOT / "scripts/train.sh").read_text()
    rows = _rows(_section("## Flags set by `scripts/train.sh`"))
    assert {_value(r[2]) for r in rows} >= {"--num_train_epochs", "--lr_scheduler_type", "--deepspeed",
                                           "--report_to", "--bf16"}
    for _, orig, flag, ours, _ in rows:
        flag, value = _value(flag), _value(ours)
        assert _same(_value(orig), value)
        direct = f"{flag} {value}" in text
        via_env = re.search(rf'{flag} "\$(\w+)"', text)
        env_default = via_env and re.search(rf'{via_env.group(1)}="\$\{{{via_env.group(1)}:?-{re.escape(value)}\}}"',
                                            text)
        assert direct or env_default, f"scripts/train.sh does not set {flag} {value}"


def test_kl_scale_table_is_generated_and_equals_the_exact_kl_ratio():
    block = re.search(r"<!-- kl-scale-table -->\n(.*?)\n<!-- /kl-scale-table -->", DOC, re.S).group(1)
    rows = kl_scale_rows(50, 3.0)
    assert block == markdown(rows), "regenerate with: python scripts/utils/kl_scale_table.py"
    factors = [r[3] for r in rows]
    assert 17 <= min(factors) < 18 and 145 <= max(factors) < 146  # the 17-145x of docs/recipe.md

    # Independent check: ours (kl_penalty with the sampler's std) / the original's (divided by 2 s^2) = 1/|dt|
    sig = make_sigmas(50, 3.0).double()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 4, 4, 4, generator=g, dtype=torch.float64)
    v_a, v_b = torch.randn(2, *x.shape, generator=g, dtype=torch.float64)
    eta = 1.0
    for j, s_j, s_next, factor in rows:
        a = sde_step("flowgrpo_sde", v_a, x, sig[j], sig[j + 1], eta, prev_sample=x)
        b = sde_step("flowgrpo_sde", v_b, x, sig[j], sig[j + 1], eta, prev_sample=x)
        ours = kl_penalty("x-based", v_theta=v_a, v_ref=v_b, mean_theta=a.mean, mean_ref=b.mean, std=a.std)
        sigma_tilde = float(sig[j + 1]) if j == 0 else float(sig[j])  # σ̃ = σ' at σ = 1
        s = eta * math.sqrt(float(sig[j]) / (1 - sigma_tilde))
        original = ((a.mean.double() - b.mean.double()) ** 2).mean(dim=(1, 2, 3)) / (2 * s**2)
        torch.testing.assert_close(ours.double() / original, torch.full((2,), factor, dtype=torch.float64),
                                   rtol=1e-4, atol=0)


@pytest.mark.parametrize("flag", ["--atrain_global_batch_size", "--rollout_global_batch_size"])
def test_the_batch_rows_link_the_global_batch_sections(flag):
    rows = {_value(r[0]): r for r in _rows(_section("## Flags of `grpo_deepgen.py`"))}
    assert "](#" in rows[flag][4]
