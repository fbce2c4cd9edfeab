"""Bandit: payouts, arm order, success, names."""

import pytest

from ragen.envs import make_env
from ragen.envs.bandit import PROMPT


@pytest.mark.parametrize("tag, safe, risky", [("bandit", "Phoenix", "Dragon"), ("bandit_test", "Trader", "Librarian"), ("bandit_rev", "Dragon", "Phoenix")])
def test_arms_pay_as_specified(tag, safe, risky):
    safe_rewards, risky_rewards = [], []
    for seed in range(4000):
        env = make_env(tag)
        env.reset(seed=seed)
        obs, reward, terminated, truncated, info = env.step(safe)
        assert terminated and not truncated and not info["success"] and obs == f"{safe}: {reward} points"
        safe_rewards.append(reward)
        env.reset(seed=seed)
        _, reward, terminated, _, info = env.step(risky.upper())
        assert terminated and info["success"]
        risky_rewards.append(reward)
    assert set(safe_rewards) == {0.1}
    assert set(risky_rewards) == {0.0, 1.0}
    p = sum(risky_rewards) / len(risky_rewards)
    assert abs(p - 0.25) < 4 * (0.25 * 0.75 / 4000) ** 0.5


def test_arm_order_is_random_per_seed_and_prompt_is_ragens():
    firsts = set()
    for seed in range(40):
        obs, _ = make_env("bandit").reset(seed=seed)
        first = "Phoenix" if obs.index("Phoenix") < obs.index("Dragon") else "Dragon"
        second = "Dragon" if first == "Phoenix" else "Phoenix"
        assert obs == PROMPT.format(a=first, b=second)
        firsts.add(first)
    assert firsts == {"Phoenix", "Dragon"}


def test_payout_draw_is_shared_by_a_group():
    """Common random numbers: every rollout of one seed sees the same risky payout."""
    for seed in range(30):
        rewards = set()
        for _ in range(4):
            env = make_env("bandit")
            env.reset(seed=seed)
            rewards.add(env.step("Dragon")[1])
        assert len(rewards) == 1
