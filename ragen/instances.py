"""Env instance tables: for each seed, the initial state and the solver's ceiling under the action budget.

The ceiling of an instance is the best any policy can do within `max_actions_per_traj` actions (RAGEN's budget:
10 for Sokoban and FrozenLake, 1 for Bandit and Countdown):
- `success_ceiling`: the optimal probability of success (0 or 1 where the env is deterministic given the seed);
- `solvable`: success_ceiling > 0;
- `optimal_moves`: fewest actions to succeed ignoring the budget (FrozenLake: the shortest path if nothing slips);
- `solver_return`: the return the solver earns when it succeeds within the budget (expected return where random);
- `solution`: the solver's answer in RAGEN's answer format ("Up || Left"), where one fixed answer exists.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable

import polars as pl

from ragen.envs import make_env
from ragen.envs.bandit import BanditEnv
from ragen.envs.base import TextEnv
from ragen.envs.countdown import CountdownEnv
from ragen.envs.frozen_lake import FrozenLakeEnv, shortest_path_length
from ragen.envs.solvers import bandit_optimal_arm, countdown_solve, frozen_lake_success_probability, sokoban_plan
from ragen.envs.sokoban import SokobanEnv

SPLITS = ("train", "val", "test")

SCHEMA = {
    "tag": pl.String,
    "split": pl.String,
    "index": pl.Int64,
    "seed": pl.Int64,
    "state": pl.String,
    "success_ceiling": pl.Float64,
    "solvable": pl.Boolean,
    "optimal_moves": pl.Int64,
    "solver_return": pl.Float64,
    "solution": pl.String,
}


@dataclass(frozen=True)
class Ceiling:
    success_ceiling: float
    optimal_moves: int | None
    solver_return: float | None
    solution: str | None


def sokoban_ceiling(env: SokobanEnv) -> Ceiling:
    plan = sokoban_plan(env.board)
    if plan is None:
        return Ceiling(0.0, None, None, None)
    within = len(plan) <= env.max_actions_per_traj
    solver_return = None
    if within:  # replay the plan on a copy to get the exact return
        replay = make_env(env.tag)
        replay.reset(seed=0, options={"layout": env.render()})
        solver_return = sum(replay.step(action)[1] for action in plan)
    return Ceiling(float(within), len(plan), solver_return, " || ".join(plan))


def frozen_lake_ceiling(env: FrozenLakeEnv) -> Ceiling:
    probability = frozen_lake_success_probability(env.render(), env.max_actions_per_traj)
    return Ceiling(probability, shortest_path_length(env.lake, env.player), probability, None)


def bandit_ceiling(env: BanditEnv) -> Ceiling:
    arm, expected = bandit_optimal_arm(env.arms)
    return Ceiling(1.0, 1, expected, arm)


def countdown_ceiling(env: CountdownEnv) -> Ceiling:
    solution = countdown_solve(env.nums, env.target)
    return Ceiling(float(solution is not None), 1 if solution else None, 1.0 if solution else None, solution)


CEILING_FNS: dict[type, Callable[[TextEnv], Ceiling]] = {
    SokobanEnv: sokoban_ceiling,
    FrozenLakeEnv: frozen_lake_ceiling,
    BanditEnv: bandit_ceiling,
    CountdownEnv: countdown_ceiling,
}


def split_seeds(*, train_seed: int, train_size: int, val_seed: int, val_size: int, test_seed: int, test_size: int) -> dict[str, list[int]]:
    """Consecutive seeds per split: train pool, fixed val set, held-out test set."""
    return {
        "train": list(range(train_seed, train_seed + train_size)),
        "val": list(range(val_seed, val_seed + val_size)),
        "test": list(range(test_seed, test_seed + test_size)),
    }


def generate_instances(tag: str, split: str, seeds: list[int]) -> pl.DataFrame:
    """One row per seed: the initial observation and its ceiling (see the module docstring)."""
    env = make_env(tag)
    ceiling_fn = CEILING_FNS[type(env)]
    rows = []
    for index, seed in enumerate(seeds):
        state, _ = env.reset(seed=seed)
        ceiling = ceiling_fn(env)
        rows.append({"tag": tag, "split": split, "index": index, "seed": seed, "state": state,
                     "solvable": ceiling.success_ceiling > 0, **asdict(ceiling)})
    return pl.DataFrame(rows, schema=SCHEMA)


def summarize_instances(table: pl.DataFrame) -> dict[str, float]:
    """Counts and mean ceilings of one table, for logging."""
    return {
        "count": float(table.height),
        "success_ceiling_mean": float(table["success_ceiling"].mean()),
        "solvable_frac": float(table["solvable"].mean()),
        "optimal_moves_mean": float(table["optimal_moves"].mean() or 0.0),
        "solver_return_mean": float(table["solver_return"].mean() or 0.0),
    }
