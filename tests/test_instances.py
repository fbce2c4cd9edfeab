"""Instance tables: one row per seed with the state and a ceiling that agrees with the solvers and the env."""

import pytest

from ragen.envs import make_env
from ragen.instances import SCHEMA, generate_instances, split_seeds, summarize_instances


def test_split_seeds_are_consecutive_and_disjoint():
    seeds = split_seeds(train_seed=10, train_size=3, val_seed=0, val_size=2, test_seed=100, test_size=1)
    assert seeds == {"train": [10, 11, 12], "val": [0, 1], "test": [100]}


@pytest.mark.parametrize("tag", ["sokoban", "sokoban_large", "frozen_lake", "bandit", "countdown"])
def test_table_rows_match_the_env(tag):
    table = generate_instances(tag, "val", [5, 6, 7])
    assert table.schema == SCHEMA
    assert table["seed"].to_list() == [5, 6, 7] and table["index"].to_list() == [0, 1, 2]
    for row in table.iter_rows(named=True):
        assert row["state"] == make_env(tag).reset(seed=row["seed"])[0]
        assert 0.0 <= row["success_ceiling"] <= 1.0
        assert row["solvable"] == (row["success_ceiling"] > 0)


def test_sokoban_solution_replays_to_its_solver_return():
    table = generate_instances("sokoban", "val", list(range(20)))
    for row in table.filter(table["solvable"]).iter_rows(named=True):
        env = make_env("sokoban")
        env.reset(seed=row["seed"])
        actions = row["solution"].split(" || ")
        assert len(actions) == row["optimal_moves"] <= 10
        total = 0.0
        for action in actions:
            _, reward, terminated, _, info = env.step(action)
            total += reward
        assert terminated and info["success"]
        assert total == pytest.approx(row["solver_return"])


def test_sokoban_beyond_budget_has_zero_ceiling():
    table = generate_instances("sokoban", "train", list(range(10000, 10100)))
    beyond = table.filter(table["optimal_moves"] > 10)
    assert beyond.height > 0  # some rooms need more than RAGEN's 10 actions
    assert beyond["success_ceiling"].to_list() == [0.0] * beyond.height


def test_same_seeds_same_table():
    assert generate_instances("frozen_lake", "val", [1, 2, 3]).equals(generate_instances("frozen_lake", "val", [1, 2, 3]))


def test_summary():
    summary = summarize_instances(generate_instances("bandit", "val", [1, 2]))
    assert summary == {"count": 2.0, "success_ceiling_mean": 1.0, "solvable_frac": 1.0,
                       "optimal_moves_mean": 1.0, "solver_return_mean": 0.25}
