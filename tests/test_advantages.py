"""GAE, GRPO and normalisation against hand-computed cases and a pure-Python oracle."""

import random

import pytest
import torch

from ragen.advantages import (compute_bilevel_gae, compute_gae, compute_grpo_advantages, compute_rft_advantages,
                              group_mean_values, group_moments, masked_mean, normalization_groups, normalize_returns,
                              place_rewards, value_targets, whiten)
from ragen.losses import explained_variance


def test_gae_with_gamma_lambda_one_is_return_minus_value():
    # one trajectory, 4 tokens, return 2.0 on the last token, values 0.5 0.5 1.0 1.5, all masked
    rewards = torch.tensor([[0.0, 0.0, 0.0, 2.0]])
    values = torch.tensor([[0.5, 0.5, 1.0, 1.5]])
    mask = torch.ones(1, 4, dtype=torch.bool)
    adv, ret = compute_gae(rewards, values, mask, gamma=1.0, lam=1.0)
    # A_t = R - V_t: 1.5 1.5 1.0 0.5; returns = R everywhere
    assert torch.allclose(adv, torch.tensor([[1.5, 1.5, 1.0, 0.5]]))
    assert torch.allclose(ret, torch.full((1, 4), 2.0))


def test_gae_by_hand_with_discounting_and_a_masked_token():
    # gamma 0.5, lam 0.5; token 1 masked (its value counts as 0)
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    values = torch.tensor([[0.2, 9.0, 0.4]])
    mask = torch.tensor([[True, False, True]])
    adv, ret = compute_gae(rewards, values, mask, gamma=0.5, lam=0.5)
    # V = 0.2, 0, 0.4.  t=2: delta = 1 - 0.4 = 0.6, A2 = 0.6
    # t=1: delta = 0 + 0.5*0.4 - 0 = 0.2, A1 = 0.2 + 0.25*0.6 = 0.35
    # t=0: delta = 0 + 0.5*0 - 0.2 = -0.2, A0 = -0.2 + 0.25*0.35 = -0.1125
    assert torch.allclose(adv, torch.tensor([[-0.1125, 0.35, 0.6]]))
    assert torch.allclose(ret, torch.tensor([[0.0875, 0.35, 1.0]]))


def oracle_gae(rewards, values, mask, gamma, lam):
    values = [v if m else 0.0 for v, m in zip(values, mask)]
    advantages, last = [0.0] * len(rewards), 0.0
    for t in reversed(range(len(rewards))):
        nxt = values[t + 1] if t + 1 < len(rewards) else 0.0
        last = rewards[t] + gamma * nxt - values[t] + gamma * lam * last
        advantages[t] = last
    return advantages


@pytest.mark.parametrize("seed", range(5))
def test_gae_matches_the_python_oracle(seed):
    rng = random.Random(seed)
    B, T = 3, 9
    rewards = [[rng.uniform(-1, 1) if rng.random() < 0.3 else 0.0 for _ in range(T)] for _ in range(B)]
    values = [[rng.uniform(-1, 1) for _ in range(T)] for _ in range(B)]
    mask = [[rng.random() < 0.7 for _ in range(T)] for _ in range(B)]
    gamma, lam = rng.uniform(0.8, 1.0), rng.uniform(0.8, 1.0)
    adv, _ = compute_gae(torch.tensor(rewards), torch.tensor(values), torch.tensor(mask), gamma=gamma, lam=lam)
    for b in range(B):
        assert adv[b].tolist() == pytest.approx(oracle_gae(rewards[b], values[b], mask[b], gamma, lam), abs=1e-5)


def test_grpo_by_hand():
    # group 0 returns 1, 2, 3: mean 2, unbiased std 1 -> -1, 0, 1; group 1 all equal -> 0
    returns = torch.tensor([1.0, 2.0, 3.0, 5.0, 5.0])
    groups = torch.tensor([0, 0, 0, 1, 1])
    mask = torch.tensor([[True, True], [True, False], [False, True], [True, True], [True, True]])
    adv, ret = compute_grpo_advantages(returns, groups, mask)
    expected = torch.tensor([[-1.0, -1.0], [0.0, 0.0], [0.0, 1.0], [0.0, 0.0], [0.0, 0.0]])
    assert torch.allclose(adv, expected, atol=1e-5) and torch.equal(adv, ret)


def test_grpo_without_std_by_hand():
    # Dr. GRPO: group 0 returns -0.5, -1.0, -0.9 (failures that differ in step penalties): mean -0.8 -> 0.3, -0.2,
    # -0.1, where the std-divided advantages would be about 1.1, -0.73, -0.37; group 1 returns 10.6, -1.0: 5.8, -5.8
    returns = torch.tensor([-0.5, -1.0, -0.9, 10.6, -1.0])
    groups = torch.tensor([0, 0, 0, 1, 1])
    mask = torch.tensor([[True, True], [True, False], [False, True], [True, True], [True, True]])
    adv, ret = compute_grpo_advantages(returns, groups, mask, by_std=False)
    expected = torch.tensor([[0.3, 0.3], [-0.2, 0.0], [0.0, -0.1], [5.8, 5.8], [-5.8, -5.8]])
    assert torch.allclose(adv, expected, atol=1e-5) and torch.equal(adv, ret)
    scaled, _ = compute_grpo_advantages(returns, groups, mask)
    assert scaled[0, 0] == pytest.approx(0.3 / 0.26458, abs=1e-3)  # unbiased std of group 0: sqrt(0.07)


def test_group_mean_values_by_hand():
    # returns from each trajectory's first masked token: group 0 -> 1 (row 0), 3 (row 1, its first masked token is
    # t=1), 2 (row 2): mean 2; group 1 -> 10, 0: mean 5. Row 1's t=0 is unmasked (its 7 is not a start)
    returns = torch.tensor([[1.0, 1.0, 0.5], [7.0, 3.0, 3.0], [2.0, 2.0, 2.0], [10.0, 10.0, 10.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[True, True, True], [False, True, True], [True, True, False], [True, True, True],
                         [True, True, True]])
    groups = torch.tensor([4, 4, 4, 9, 9])
    values = group_mean_values(returns, groups, mask)
    expected = torch.tensor([[2.0, 2.0, 2.0], [0.0, 2.0, 2.0], [2.0, 2.0, 0.0], [5.0, 5.0, 5.0], [5.0, 5.0, 5.0]])
    assert torch.equal(values, expected)


def test_group_mean_values_explain_the_between_group_share():
    # returns constant along each trajectory: group 0 -> 0, 2 (mean 1), group 1 -> 4, 6 (mean 5). Total variance
    # around the grand mean 3 is (9 + 1 + 1 + 9) = 20 (x 3 tokens), the within-group residuals +-1 give 4 (x 3):
    # unbiased variances over 12 tokens are 60/11 and 12/11, so the explained share is 1 - 12/60 = 0.8
    returns = torch.tensor([0.0, 2.0, 4.0, 6.0])[:, None].expand(4, 3).clone()
    mask = torch.ones(4, 3, dtype=torch.bool)
    values = group_mean_values(returns, torch.tensor([0, 0, 1, 1]), mask)
    assert explained_variance(values, returns, mask) == pytest.approx(0.8)
    # a group per trajectory explains everything; one group for all explains nothing
    assert explained_variance(group_mean_values(returns, torch.tensor([0, 1, 2, 3]), mask), returns,
                              mask) == pytest.approx(1.0)
    assert explained_variance(group_mean_values(returns, torch.zeros(4, dtype=torch.long), mask), returns,
                              mask) == pytest.approx(0.0, abs=1e-6)


def test_rft_is_one_on_every_trained_token():
    mask = torch.tensor([[False, True, True], [True, False, True]])
    adv, ret = compute_rft_advantages(mask)
    assert adv.tolist() == [[0.0, 1.0, 1.0], [1.0, 0.0, 1.0]] and torch.equal(adv, ret)


def test_normalize_returns_methods():
    returns = torch.tensor([0.0, 4.0, 10.0, 10.0])
    groups = torch.tensor([0, 0, 1, 1])
    assert torch.equal(normalize_returns(returns, groups, method="identity"), returns)
    assert torch.allclose(normalize_returns(returns, groups, method="mean"), torch.tensor([-2.0, 2.0, 0.0, 0.0]))
    # group 0: std of (0, 4) unbiased = 2.828..; (x - 2) / std = -0.7071, 0.7071
    assert torch.allclose(normalize_returns(returns, groups, method="mean_std"), torch.tensor([-0.7071, 0.7071, 0, 0]), atol=1e-4)
    wide = torch.tensor([0.0, 0.0, 0.0, 0.0, 100.0])
    clipped = normalize_returns(wide, torch.zeros(5, dtype=torch.long), method="asym_clip")
    assert clipped.max() <= 3.0 and clipped.min() >= -1.0
    # a group of one keeps its return under every method; an unknown method names the known ones
    for method in ("mean", "mean_std", "asym_clip"):
        assert normalize_returns(torch.tensor([7.0, 1.0, 3.0]), torch.tensor([5, 0, 0]), method=method)[0] == 7.0
    with pytest.raises(ValueError, match="mean_std"):
        normalize_returns(returns, groups, method="zscore")
    # a non-finite return is not scored away: its group stays non-finite (the update then skips the step)
    for method in ("mean", "mean_std", "asym_clip"):
        scores = normalize_returns(torch.tensor([float("inf"), 1.0, 2.0, 4.0]), groups, method=method)
        assert not scores[:2].isfinite().any() and scores[2:].isfinite().all()


def test_group_moments_by_hand():
    # group 7: 1, 5 -> mean 3, unbiased std sqrt((4 + 4) / 1) = 2.8284; group 3: a lone 5 -> mean 5, std 0;
    # group 0: eight float32 10.9s -> exactly their value and std 0 (float64); ids come back sorted
    x = torch.tensor([1.0, 5.0, 5.0] + [10.9] * 8)
    m = group_moments(x, torch.tensor([7, 3, 7] + [0] * 8))
    assert m.groups.tolist() == [0, 3, 7]
    assert m.index.tolist() == [2, 1, 2] + [0] * 8
    assert m.counts.tolist() == [8.0, 1.0, 2.0]
    assert m.means.tolist() == [float(x[3]), 5.0, 3.0]
    assert m.stds[:2].tolist() == [0.0, 0.0]
    assert m.stds[2].item() == pytest.approx(8 ** 0.5)
    assert m.means.dtype == m.stds.dtype == torch.float64


def test_a_group_of_equal_returns_scores_zero_whatever_their_float32_rounding():
    # eight one-move Sokoban solves, 10 + 1 - 0.1 = 10.9 each: in float32 their mean is 9.5e-07 (one unit in the
    # last place) above 10.9 and their std 1.02e-06 > eps, which scored every member -0.472 before the float64 fix
    returns = torch.full((8,), 10.9)
    groups = torch.zeros(8, dtype=torch.long)
    assert float(returns.mean() - returns[0]) == pytest.approx(9.5367e-07, rel=1e-3)  # the float32 rounding
    for method in ("mean", "mean_std", "asym_clip"):
        assert normalize_returns(returns, groups, method=method).tolist() == [0.0] * 8
    adv, _ = compute_grpo_advantages(returns, groups, torch.ones(8, 3, dtype=torch.bool))
    assert adv.abs().max().item() == 0.0
    # beside a group with a spread, the solved group still scores 0 and the other one its z-scores by hand
    mixed = torch.tensor([10.9] * 4 + [0.0, 0.0, 10.9, 10.9])
    scores = normalize_returns(mixed, torch.tensor([0] * 4 + [1] * 4), method="mean_std")
    # group 1: mean 5.45, unbiased std sqrt(4 * 5.45^2 / 3) = 6.2931; (x - 5.45) / std = -0.8660, 0.8660
    assert scores[:4].tolist() == [0.0] * 4
    assert torch.allclose(scores[4:], torch.tensor([-0.8660, -0.8660, 0.8660, 0.8660]), atol=1e-4)


def test_normalization_groups_by_state_env_or_batch():
    group_ids = torch.tensor([0, 0, 1, 1, 2])
    tags = ["sokoban", "sokoban", "frozen_lake", "frozen_lake", "sokoban"]
    assert normalization_groups(group_ids, tags, "state").tolist() == [0, 0, 1, 1, 2]
    assert normalization_groups(group_ids, tags, "inductive").tolist() == [0, 0, 1, 1, 0]
    assert normalization_groups(group_ids, tags, "batch").tolist() == [0, 0, 0, 0, 0]
    with pytest.raises(ValueError, match="grouping 'states'; use state, inductive or batch"):
        normalization_groups(group_ids, tags, "states")


def test_normalize_returns_over_the_batch():
    returns = torch.tensor([1.0, 3.0, 5.0, 7.0])
    batch = normalization_groups(torch.tensor([0, 0, 1, 1]), ["bandit"] * 4, "batch")
    assert normalize_returns(returns, batch, method="mean").tolist() == [-3.0, -1.0, 1.0, 3.0]
    # unbiased std of (1, 3, 5, 7) = sqrt(20 / 3) = 2.5820; (x - 4) / std
    expected = torch.tensor([-1.1619, -0.3873, 0.3873, 1.1619])
    assert torch.allclose(normalize_returns(returns, batch, method="mean_std"), expected, atol=1e-4)


def test_whiten_and_masked_mean():
    x = torch.tensor([[1.0, 2.0, 3.0, 100.0]])
    mask = torch.tensor([[True, True, True, False]])
    assert masked_mean(x, mask).item() == pytest.approx(2.0)
    w = whiten(x, mask)
    # mean 2, unbiased var 1 -> -1, 0, 1 on the masked entries
    assert w[0, :3].tolist() == pytest.approx([-1.0, 0.0, 1.0], abs=1e-4)


def test_place_rewards_on_last_token():
    r = place_rewards(torch.tensor([1.5, -0.1]), torch.ones(2, 3, dtype=torch.long))
    assert torch.allclose(r, torch.tensor([[0.0, 0.0, 1.5], [0.0, 0.0, -0.1]]))


def bilevel_case():
    """Two turns: env token, two sampled tokens (turn 1 ends at 2), env token, two sampled tokens (turn 2 ends at 5)."""
    rewards = torch.tensor([[0.0, 0.0, 0.5, 0.0, 0.0, 1.0]])
    values = torch.tensor([[9.0, 0.1, 0.2, 9.0, 0.3, 0.4]])  # values on env tokens must not matter
    mask = torch.tensor([[False, True, True, False, True, True]])
    ends = torch.tensor([[False, False, True, False, False, True]])
    return rewards, values, mask, ends


def test_bilevel_gae_by_hand():
    # high level (turn_gamma 0.5, lam 1): A_2 = 1.0 - 0.4 = 0.6, G_2 = 1.0;
    #   A_1 = 0.5 + 0.5 * 0.4 - 0.2 + 0.5 * 0.6 = 0.8, G_1 = 1.0
    # low level (gamma = lam = 1): turn end gets G_k - V, the token before it V_end - V_t + that
    rewards, values, mask, ends = bilevel_case()
    adv, ret = compute_bilevel_gae(rewards, values, mask, ends, gamma=1.0, lam=1.0, turn_gamma=0.5, turn_lam=1.0)
    assert adv.tolist()[0] == pytest.approx([0.0, 0.9, 0.8, 0.0, 0.7, 0.6])
    assert ret.tolist()[0] == pytest.approx([0.0, 1.0, 1.0, 0.0, 1.0, 1.0])


def test_bilevel_gae_token_discounting_and_turn_lambda():
    # turn_gamma 1, turn_lam 0: A_1 = 0.5 + 0.4 - 0.2 = 0.7 (one-step TD between turns), G_1 = 0.9; A_2 = 0.6, G_2 = 1.0
    # gamma 0.5, lam 0.5 inside turn 1: A_2 = 0.7; delta_1 = 0.5 * 0.2 - 0.1 = 0; A_1 = 0 + 0.25 * 0.7 = 0.175
    rewards, values, mask, ends = bilevel_case()
    adv, ret = compute_bilevel_gae(rewards, values, mask, ends, gamma=0.5, lam=0.5, turn_gamma=1.0, turn_lam=0.0)
    assert adv.tolist()[0] == pytest.approx([0.0, 0.175, 0.7, 0.0, 0.5 * 0.4 - 0.3 + 0.25 * 0.6, 0.6])
    assert ret[0, 2].item() == pytest.approx(0.9)


def test_bilevel_gae_sees_zero_reward_turns_and_rewards_after_the_last_turn():
    # RAGEN finds turns by reward != 0; a turn that earned 0 is still a turn here, and the return placed on the
    # sequence's last (env) token counts for the last turn.
    rewards = torch.tensor([[0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 2.0]])
    values = torch.tensor([[0.0, 0.1, 0.2, 0.0, 0.3, 0.4, 0.0]])
    mask = torch.tensor([[False, True, True, False, True, True, False]])
    ends = torch.tensor([[False, False, True, False, False, True, False]])
    adv, ret = compute_bilevel_gae(rewards, values, mask, ends, gamma=1.0, lam=1.0, turn_gamma=1.0, turn_lam=1.0)
    assert adv.tolist()[0] == pytest.approx([0.0, 1.9, 1.8, 0.0, 1.7, 1.6, 0.0])  # G = 2 on both turns
    # with gamma = lam = 1 and one turn it is GAE restricted to the turn's tokens: A_t = R - V_t
    one_turn = torch.tensor([[False, False, False, False, False, True, False]])
    adv, _ = compute_bilevel_gae(rewards, values, mask, one_turn, gamma=1.0, lam=1.0, turn_gamma=0.5, turn_lam=1.0)
    assert adv.tolist()[0] == pytest.approx([0.0, 1.9, 1.8, 0.0, 1.7, 1.6, 0.0])


def test_bilevel_gae_keeps_in_turn_token_rewards_at_token_level():
    # a KL-in-reward penalty on a sampled token inside turn 1 enters that token's delta, not the turn reward
    rewards, values, mask, ends = bilevel_case()
    rewards[0, 1] = -0.05
    adv, _ = compute_bilevel_gae(rewards, values, mask, ends, gamma=1.0, lam=1.0, turn_gamma=0.5, turn_lam=1.0)
    assert adv.tolist()[0] == pytest.approx([0.0, 0.85, 0.8, 0.0, 0.7, 0.6])


def test_value_targets_are_monte_carlo_returns():
    rewards, _, mask, ends = bilevel_case()  # turn 1 earns 0.5 (at token 2), turn 2 earns 1.0 (at token 5)
    # bilevel_gae, turn_gamma 0.5: turn 1's tokens 0.5 + 0.5 * 1.0 = 1.0, turn 2's tokens 1.0 (not 1.5: turn 1's
    # reward is in the past); with turn_gamma 1 turn 1 gets 1.5
    targets = value_targets(rewards, mask, ends, advantage="bilevel_gae", gamma=1.0, turn_gamma=0.5)
    assert targets[mask].tolist() == pytest.approx([1.0, 1.0, 1.0, 1.0])
    targets = value_targets(rewards, mask, ends, advantage="bilevel_gae", gamma=1.0, turn_gamma=1.0)
    assert targets[mask].tolist() == pytest.approx([1.5, 1.5, 1.0, 1.0])
    # gae over token positions: the reward-to-go, discounted by gamma per position (env tokens count as steps)
    targets = value_targets(rewards, mask, ends, advantage="gae", gamma=1.0, turn_gamma=0.5)
    assert targets[mask].tolist() == pytest.approx([1.5, 1.5, 1.0, 1.0])
    targets = value_targets(rewards, mask, ends, advantage="gae", gamma=0.5, turn_gamma=0.5)
    # token 5: 1.0; 4: 0.5; 2: 0.5 + 0.5 * (0 + 0.5 * 0.5) = 0.625; 1: 0.3125
    assert targets[mask].tolist() == pytest.approx([0.3125, 0.625, 0.5, 1.0])
    # the return on the last token with gamma 1: R on every token, the old warm-up target
    last = place_rewards(torch.tensor([2.5]), torch.ones(1, 6, dtype=torch.long))
    assert value_targets(last, mask, ends, advantage="gae", gamma=1.0, turn_gamma=0.5)[mask].tolist() == [2.5] * 4
    with pytest.raises(ValueError, match="grpo.*no critic"):
        value_targets(rewards, mask, ends, advantage="grpo", gamma=1.0, turn_gamma=0.5)
