"""Uncertainty filtering: whole groups, unbiased std, ties, reverse mode, DAPO's zero-variance removal and RAGEN-2's
top-p share of the std mass; the best success of each group (rft)."""

import pytest
import torch

from ragen.filters import best_success_per_group, filter_groups_by_reward_std, top_p_count


def batch(groups_returns):
    returns = torch.tensor([r for group in groups_returns for r in group])
    ids = torch.tensor([g for g, group in enumerate(groups_returns) for _ in group])
    return returns, ids


def test_top_quarter_by_unbiased_std():
    # 8 groups of 2: std of (0, x) unbiased = x / sqrt(2); the two largest spreads are groups 5 and 2
    returns, ids = batch([[0, 1], [0, 0], [0, 6], [0, 2], [0, 0.5], [0, 9], [1, 1], [0, 3]])
    keep, stats = filter_groups_by_reward_std(returns, ids, keep_ratio=0.25)
    assert keep.tolist() == [False] * 4 + [True] * 2 + [False] * 4 + [True] * 2 + [False] * 4
    assert stats.kept_groups == 2 and stats.kept_frac == pytest.approx(0.25)
    assert stats.std_mass_kept == pytest.approx((6 + 9) / (1 + 6 + 2 + 0.5 + 9 + 3))
    assert stats.frac_zero_std == pytest.approx(2 / 8)


def test_ties_keep_the_lower_group_id():
    returns, ids = batch([[0, 1], [0, 1], [0, 1], [0, 0]])
    keep, _ = filter_groups_by_reward_std(returns, ids, keep_ratio=0.5)
    assert keep.tolist() == [True, True, True, True, False, False, False, False]


def test_keep_ratio_one_keeps_everything_and_rev_keeps_the_calmest():
    returns, ids = batch([[0, 5], [1, 1], [0, 2], [3, 3]])
    keep, stats = filter_groups_by_reward_std(returns, ids, keep_ratio=1.0)
    assert keep.all() and stats.kept_frac == 1.0
    rev, _ = filter_groups_by_reward_std(returns, ids, keep_ratio=0.5, mode="std_rev")
    assert rev.tolist() == [False, False, True, True, False, False, True, True]


def test_nonzero_mode_drops_zero_variance_groups():
    returns, ids = batch([[0, 5], [1, 1], [0, 2], [3, 3]])
    keep, stats = filter_groups_by_reward_std(returns, ids, keep_ratio=0.25, mode="nonzero")
    assert keep.tolist() == [True, True, False, False, True, True, False, False]
    assert stats.std_mass_kept == 1.0


def test_a_group_of_equal_returns_has_zero_std_whatever_their_float32_rounding():
    # eight one-move Sokoban solves of 10.9 each: float32's std of them is 1.02e-06, so DAPO's mode kept the group
    returns, ids = batch([[10.9] * 8, [0.0] * 4 + [10.9] * 4])
    assert returns[:8].std().item() > 0  # the float32 rounding the filter must not see
    keep, stats = filter_groups_by_reward_std(returns, ids, keep_ratio=1.0, mode="nonzero")
    assert keep.tolist() == [False] * 8 + [True] * 8
    assert stats.frac_zero_std == 0.5 and stats.std_mass_kept == 1.0


def test_top_p_keeps_the_fewest_largest_spreads_that_hold_the_share_of_std_mass():
    # groups of 2, std of (0, x) = x / sqrt(2): stds 4, 0, 1, 3, 2 (times 1/sqrt 2), mass 10 / sqrt 2
    returns, ids = batch([[0, 4], [2, 2], [0, 1], [0, 3], [0, 2]])
    expected = {  # p -> kept groups: the threshold p * 10 / sqrt 2 - 0.01, reached by the running sum 4, 7, 9, 10
        0.9: [0, 3, 4],  # 9 / sqrt 2 = 6.36 >= 6.35
        0.7: [0, 3],  # 7 >= 7 - 0.01 * sqrt 2
        0.69: [0, 3],
        0.4: [0],  # the largest alone holds 0.4
        0.41: [0, 3],
        1.0: [0, 2, 3, 4],  # every group with a spread, none without
    }
    for p, groups in expected.items():
        keep, stats = filter_groups_by_reward_std(returns, ids, keep_ratio=p, mode="top_p")
        assert keep.tolist() == [g in groups for g in range(5) for _ in range(2)], p
        assert stats.kept_groups == len(groups)
    _, stats = filter_groups_by_reward_std(returns, ids, keep_ratio=0.9, mode="top_p")
    assert stats.std_mass_kept == pytest.approx(0.9) and stats.kept_frac == pytest.approx(0.6)


def test_top_p_count_ties_eps_and_no_spread():
    stds = torch.tensor([2.0, 2.0, 2.0, 2.0])  # sorted, descending
    assert top_p_count(stds, 0.5) == 2 and top_p_count(stds, 0.51) == 3
    # the eps makes p = 1 reachable when the running sum falls a rounding short of the total
    assert top_p_count(torch.tensor([0.1] * 10), 1.0) == 10
    assert top_p_count(torch.tensor([1.0, 1.0]), 1.0, eps=0.0) == 2
    assert top_p_count(torch.tensor([3.0, 1.0]), 0.75, eps=0.0) == 1 and top_p_count(torch.tensor([3.0, 1.0]), 0.76,
                                                                                     eps=0.0) == 2
    assert top_p_count(torch.zeros(3), 0.9) == 0  # no group has a spread: none kept
    returns, ids = batch([[1, 1], [0, 0]])
    keep, stats = filter_groups_by_reward_std(returns, ids, keep_ratio=0.9, mode="top_p")
    assert not keep.any() and stats.kept_groups == 0 and stats.std_mass_kept == 1.0
    # ties: the lower group id first, as in mode std (stds 1, 2, 2, 1 over sqrt 2; 0.3 of the mass: one group of 2)
    returns, ids = batch([[0, 1], [0, 2], [0, 2], [0, 1]])
    keep, _ = filter_groups_by_reward_std(returns, ids, keep_ratio=0.3, mode="top_p")
    assert keep.tolist() == [False, False, True, True, False, False, False, False]


def test_unknown_mode_is_an_error():
    returns, ids = batch([[0, 1]])
    with pytest.raises(ValueError, match="unknown filter mode"):
        filter_groups_by_reward_std(returns, ids, 0.5, mode="max_mean")


def test_best_success_keeps_one_per_group_by_return_then_fewest_actions():
    # group 0: two successes of equal return, the one with fewer actions wins over the earlier one;
    # group 1: a failure with the highest return is never kept, the better of two successes is;
    # group 2: no success, nothing kept; group 3: two identical successes, the first is kept
    returns = torch.tensor([9.7, 9.7, -1.0, 0.0,   -0.1, 9.5, 9.8, 9.6,   -0.3, -0.5, 0.0, -1.0,   9.9, 9.9])
    ids = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3])
    success = torch.tensor([1, 1, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 1, 1], dtype=torch.bool)
    actions = torch.tensor([3, 2, 10, 0, 1, 5, 2, 4, 3, 5, 0, 10, 1, 1])
    keep = best_success_per_group(returns, ids, success, actions)
    assert torch.nonzero(keep).flatten().tolist() == [1, 6, 12]
    assert not best_success_per_group(returns, ids, torch.zeros(14, dtype=torch.bool), actions).any()
