import statistics

import pytest
import torch

from deepgen_rl.rl import ADV_TYPES, GROUP_BASELINE_ADV_TYPES, compute_advantages
from deepgen_rl.rl.advantages import BASELINE_SCOPE

EPS = 1e-4


def _t(rows):
    return torch.tensor(rows, dtype=torch.float32)


# Two groups (ids 7 and 3, interleaved), two rewards with weights (0.5, 1.0).
REWARDS = _t([[1.0, 0.0], [0.2, 0.9], [0.0, 1.0], [0.7, 0.1], [1.0, 1.0], [0.4, 0.6], [0.9, 0.3]])
WEIGHTS = _t([[0.5, 1.0]] * 7)
GROUPS = torch.tensor([7, 3, 7, 3, 7, 3, 3])


def _hand_R():
    return [0.5 * r0 + 1.0 * r1 for r0, r1 in REWARDS.tolist()]


def _members(gid):
    return [i for i, g in enumerate(GROUPS.tolist()) if g == gid]


def test_grpo_hand_computed():
    R = _hand_R()
    out = compute_advantages("grpo", REWARDS, WEIGHTS, GROUPS)
    expected = [0.0] * 7
    for gid in (7, 3):
        idx = _members(gid)
        vals = [R[i] for i in idx]
        m, s = statistics.mean(vals), statistics.stdev(vals)
        for i in idx:
            expected[i] = (R[i] - m) / (s + EPS)
    torch.testing.assert_close(out.advantages, torch.tensor(expected), rtol=1e-6, atol=1e-6)
    assert out.advantages.dtype == torch.float32 and out.advantages.shape == (7,)
    assert out.stats["num_no_valid_reward"] == 0 and out.stats["zero_std_group_fraction"] == 0.0


def test_grpo_global_std_hand_computed():
    R = _hand_R()
    out = compute_advantages("grpo_global_std", REWARDS, WEIGHTS, GROUPS)
    s = statistics.stdev(R)
    expected = [0.0] * 7
    for gid in (7, 3):
        idx = _members(gid)
        m = statistics.mean(R[i] for i in idx)
        for i in idx:
            expected[i] = (R[i] - m) / (s + EPS)
    torch.testing.assert_close(out.advantages, torch.tensor(expected), rtol=1e-6, atol=1e-6)


def test_reinforcepp_hand_computed():
    R = _hand_R()
    out = compute_advantages("reinforcepp", REWARDS, WEIGHTS, GROUPS)
    m, s = statistics.mean(R), statistics.stdev(R)
    torch.testing.assert_close(out.advantages, torch.tensor([(r - m) / (s + EPS) for r in R]), rtol=1e-6, atol=1e-6)


def test_gdpo_hand_computed():
    out = compute_advantages("gdpo", REWARDS, WEIGHTS, GROUPS)
    r = REWARDS.tolist()
    a_hat = [[0.0, 0.0] for _ in range(7)]
    for gid in (7, 3):
        idx = _members(gid)
        for k in range(2):
            vals = [r[i][k] for i in idx]
            m, s = statistics.mean(vals), statistics.stdev(vals)
            for i in idx:
                a_hat[i][k] = (r[i][k] - m) / (s + EPS)
    C = [0.5 * a0 + 1.0 * a1 for a0, a1 in a_hat]
    m, s = statistics.mean(C), statistics.stdev(C)
    torch.testing.assert_close(out.advantages, torch.tensor([(c - m) / (s + EPS) for c in C]), rtol=1e-5, atol=1e-5)


def test_gdpo_separates_reward_combinations_that_grpo_collapses():
    # (1,0), (0,1), (0,1) all sum to 1 -> identical GRPO advantages; GDPO normalises each reward first.
    rewards = _t([[1, 0], [0, 1], [0, 1], [0, 0]])
    weights = torch.ones(4, 2)
    groups = torch.zeros(4, dtype=torch.long)
    grpo = compute_advantages("grpo", rewards, weights, groups).advantages
    gdpo = compute_advantages("gdpo", rewards, weights, groups).advantages
    assert grpo[0] == grpo[1] == grpo[2]
    assert abs(float(gdpo[0] - gdpo[1])) > 0.1
    assert torch.equal(gdpo[1], gdpo[2])


@pytest.mark.parametrize("adv_type", GROUP_BASELINE_ADV_TYPES)  # a batch-scope type has the batch as its one group
def test_constant_reward_group_gives_zero(adv_type):
    rewards = _t([[0.3], [0.3], [0.3], [0.1], [0.9], [0.5]])
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    out = compute_advantages(adv_type, rewards, torch.ones(6, 1), groups)
    if adv_type == "gdpo":
        # The group's term is exactly 0; the batch re-centring subtracts mean C, which is 0 up to rounding here.
        torch.testing.assert_close(out.advantages[:3], torch.zeros(3), rtol=0, atol=1e-12)
    else:
        assert torch.equal(out.advantages[:3], torch.zeros(3))
    assert (out.advantages[3:] != 0).any()
    assert out.stats["zero_std_group_fraction"] == 0.5


@pytest.mark.parametrize("adv_type", ADV_TYPES)
def test_baseline_scope_decides_whether_a_constant_group_gets_zero(adv_type):
    # group 0 is constant (0.3), group 1 is not: a group baseline gives group 0 exactly 0, a batch baseline does not
    rewards = _t([[0.3], [0.3], [0.3], [0.1], [0.9], [0.5]])
    out = compute_advantages(adv_type, rewards, torch.ones(6, 1), torch.tensor([0, 0, 0, 1, 1, 1]))
    group_zero = bool((out.advantages[:3].abs() < 1e-6).all())
    assert group_zero == (BASELINE_SCOPE[adv_type] == "group"), (adv_type, out.advantages.tolist())
    assert (adv_type in GROUP_BASELINE_ADV_TYPES) == (BASELINE_SCOPE[adv_type] == "group")


def test_reinforcepp_constant_batch_gives_zero():
    out = compute_advantages("reinforcepp", torch.full((5, 1), 0.3), torch.ones(5, 1), torch.arange(5))
    assert torch.equal(out.advantages, torch.zeros(5))
    assert out.stats["zero_std_group_fraction"] == 1.0


@pytest.mark.parametrize("adv_type", ADV_TYPES)
def test_invalid_reward_does_not_enter_statistics(adv_type):
    rewards = _t([[0.1], [0.7], [0.4], [123.0], [0.9], [0.2], [0.5]])
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 1])
    valid = torch.tensor([[True], [True], [True], [False], [True], [True], [True]])
    out = compute_advantages(adv_type, rewards, torch.ones(7, 1), groups, valid=valid)
    keep = torch.tensor([0, 1, 2, 4, 5, 6])
    ref = compute_advantages(adv_type, rewards[keep], torch.ones(6, 1), groups[keep])
    torch.testing.assert_close(out.advantages[keep], ref.advantages, rtol=0, atol=1e-7)
    assert out.advantages[3] == 0
    assert out.stats["num_no_valid_reward"] == 1
    # The failed value itself is irrelevant (even NaN).
    rewards_nan = rewards.clone()
    rewards_nan[3, 0] = float("nan")
    again = compute_advantages(adv_type, rewards_nan, torch.ones(7, 1), groups, valid=valid)
    assert torch.equal(again.advantages, out.advantages)


def test_grpo_partially_failed_image_uses_only_its_present_terms():
    # Image 3 lost reward 1: it is left out of the group statistics of R, and its advantage compares its
    # reward-0 term with the group's mean reward-0 term.
    rewards = _t([[1.0, 0.0], [0.2, 0.9], [0.0, 1.0], [0.6, float("nan")]])
    weights = _t([[0.5, 1.0]] * 4)
    groups = torch.zeros(4, dtype=torch.long)
    valid = torch.tensor([[True, True], [True, True], [True, True], [True, False]])
    out = compute_advantages("grpo", rewards, weights, groups, valid=valid)
    ref = compute_advantages("grpo", rewards[:3], weights[:3], groups[:3])
    torch.testing.assert_close(out.advantages[:3], ref.advantages, rtol=0, atol=1e-7)
    R = [0.5 * 1.0 + 0.0, 0.5 * 0.2 + 0.9, 0.5 * 0.0 + 1.0]
    term0_mean = statistics.mean([0.5 * 1.0, 0.5 * 0.2, 0.5 * 0.0])
    expected = (0.5 * 0.6 - term0_mean) / (statistics.stdev(R) + EPS)
    torch.testing.assert_close(out.advantages[3], torch.tensor(expected), rtol=1e-6, atol=1e-6)
    assert out.stats["num_partial_reward"] == 1 and out.stats["num_no_valid_reward"] == 0


def test_gdpo_failed_reward_equals_unweighted_reward():
    rewards = _t([[1.0, 0.0], [0.2, 0.9], [0.0, 1.0], [0.6, 0.3], [0.5, 0.5], [0.1, 0.8]])
    weights = _t([[0.5, 1.0]] * 6)
    groups = torch.tensor([0, 0, 0, 0, 1, 1])
    valid = torch.ones(6, 2, dtype=torch.bool)
    valid[3, 1] = False
    failed = compute_advantages("gdpo", rewards, weights, groups, valid=valid)
    unweighted = weights.clone()
    unweighted[3, 1] = 0.0
    ref = compute_advantages("gdpo", rewards, unweighted, groups)
    torch.testing.assert_close(failed.advantages, ref.advantages, rtol=0, atol=1e-7)
    changed = rewards.clone()
    changed[3, 1] = 1e6
    assert torch.equal(compute_advantages("gdpo", changed, weights, groups, valid=valid).advantages,
                       failed.advantages)


@pytest.mark.parametrize("adv_type", GROUP_BASELINE_ADV_TYPES)
def test_single_valid_member_group_gives_zero(adv_type):
    rewards = _t([[0.2], [0.8], [0.1], [0.9]])
    groups = torch.tensor([0, 0, 1, 1])
    valid = torch.tensor([[True], [False], [True], [True]])
    out = compute_advantages(adv_type, rewards, torch.ones(4, 1), groups, valid=valid)
    assert torch.isfinite(out.advantages).all()
    assert out.advantages[0] == 0 and out.advantages[1] == 0
    assert out.advantages[2] < 0 < out.advantages[3]


@pytest.mark.parametrize("adv_type", ADV_TYPES)
def test_clamp_to_clip_max(adv_type):
    rewards = _t([[0.0]] * 7 + [[10.0]])
    out = compute_advantages(adv_type, rewards, torch.ones(8, 1), torch.zeros(8, dtype=torch.long), clip_max=2.0)
    # Outlier: (10 − 1.25) / (sqrt(12.5) + ε) ≈ 2.47 (> 2) before clamping (gdpo's second normalisation keeps it).
    assert out.advantages.abs().max() == 2.0 and out.advantages[7] == 2.0
    assert out.stats["clamp_fraction"] == pytest.approx(1 / 8)
    assert compute_advantages(adv_type, rewards, torch.ones(8, 1), torch.zeros(8, dtype=torch.long)).stats[
        "clamp_fraction"] == 0.0


@pytest.mark.parametrize("adv_type", ADV_TYPES)
def test_image_without_valid_weighted_reward_gets_zero_and_is_counted(adv_type):
    rewards = _t([[0.1, 0.5], [0.7, 0.2], [0.4, 0.9], [0.3, 0.3], [0.8, 0.6]])
    weights = _t([[1.0, 1.0], [1.0, 1.0], [1.0, 1.0], [0.0, 0.0], [1.0, 0.0]])
    valid = torch.ones(5, 2, dtype=torch.bool)
    valid[4, 0] = False  # its only weighted reward failed
    out = compute_advantages(adv_type, rewards, weights, torch.zeros(5, dtype=torch.long), valid=valid)
    assert out.advantages[3] == 0 and out.advantages[4] == 0
    assert out.stats["num_no_valid_reward"] == 2
    assert (out.advantages[:3] != 0).all()
    for key in ("zero_std_group_fraction", "clamp_fraction", "advantage_mean", "advantage_std"):
        assert isinstance(out.stats[key], float)


def test_unknown_adv_type_raises():
    with pytest.raises(ValueError):
        compute_advantages("ppo", REWARDS, WEIGHTS, GROUPS)
