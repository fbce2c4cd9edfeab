"""Countdown: rewards, the safe parser against hostile input, generated instances."""

import time
from fractions import Fraction

import pytest

from ragen.envs import make_env
from ragen.envs.arithmetic import ExpressionError, evaluate
from ragen.envs.solvers import countdown_solve


def load(layout: str):
    env = make_env("countdown")
    env.reset(seed=0, options={"layout": layout})
    return env


@pytest.mark.parametrize(
    "answer, reward, success",
    [
        ("(3 + 5) * 2", 1.0, True),  # 16, uses 3 5 2
        ("2 * (5 + 3)", 1.0, True),
        ("3 + 5 + 2", 0.1, False),  # uses them, 10 != 16
        ("3 * 5 / (2 - 2)", 0.0, False),  # uses 2 twice: other numbers
        ("16", 0.0, False),  # right value, wrong numbers
        ("(3 + 5) * 2 * 1", 0.0, False),  # an extra number
        ("5 * 3 / (2 - 2) ", 0.0, False),
        ("3 / (5 - 5) * 2", 0.0, False),
    ],
)
def test_rewards(answer, reward, success):
    env = load("Target: 16, nums: [3, 5, 2]")
    obs, r, terminated, truncated, info = env.step(answer)
    assert r == reward and info["success"] == success and info["action_is_valid"]
    assert terminated and not truncated


def test_division_by_zero_with_the_right_numbers_misses():
    env = load("Target: 4, nums: [2, 2, 1]")
    _, reward, terminated, _, info = env.step("1 / (2 - 2)")
    assert reward == 0.1 and terminated and not info["success"]


def test_exact_rational_arithmetic():
    env = load("Target: 3, nums: [6, 4, 2]")
    assert env.step("6 / 4 * 2")[1] == 1.0


@pytest.mark.parametrize(
    "hostile",
    [
        "__import__('os').system('touch /tmp/ragen_pwned')",
        "open('/etc/passwd').read()",
        "2 ** 100000000",
        "9**9**9**9",
        "(lambda: 1)()",
        "1e308 * 10",
        "-3 + 5 + 2",
        "3.5 + 5 + 2",
        "3 + 5 + 2; import os",
        "1" * 50,
        "(" * 120 + "1" + ")" * 120,
    ],
)
def test_hostile_input_scores_zero_and_executes_nothing(hostile, tmp_path):
    env = load("Target: 16, nums: [3, 5, 2]")
    start = time.perf_counter()
    obs, reward, terminated, _, info = env.step(hostile)
    assert time.perf_counter() - start < 0.05
    assert reward == 0.0 and not info["success"] and not terminated and not info["action_is_valid"]
    assert obs == "Target: 16, nums: [3, 5, 2]"
    assert not (tmp_path / "ragen_pwned").exists()
    import os
    assert not os.path.exists("/tmp/ragen_pwned")


def test_parser_precedence_and_numbers():
    assert evaluate("2 + 3 * 4") == (Fraction(14), [2, 3, 4])
    assert evaluate("(2 + 3) * 4") == (Fraction(20), [2, 3, 4])
    assert evaluate("8 - 3 - 2") == (Fraction(3), [8, 3, 2])  # left-associative
    assert evaluate("8 / 4 / 2") == (Fraction(1), [8, 4, 2])
    assert evaluate("1 / (3 - 3)") == (None, [1, 3, 3])
    for bad in ["", "()", "1 +", "(1 + 2", "1 2", "1 + + 2", "a"]:
        with pytest.raises(ExpressionError):
            evaluate(bad)


def test_generated_instances_are_solvable_by_the_solver():
    for seed in range(30):
        env = make_env("countdown")
        obs, _ = env.reset(seed=seed)
        assert obs.startswith(f"Target: {env.target}, nums: ")
        assert len(env.nums) in (3, 4) and 1 <= env.target <= 99
        solution = countdown_solve(env.nums, env.target)
        assert solution is not None
        _, reward, _, _, info = env.step(solution)
        assert reward == 1.0 and info["success"]
