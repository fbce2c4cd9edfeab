"""Signal benchmark: how much one action moves the chance of success, per env; prints a table (not a test).

    python bench/bench_signal.py [--envs sokoban frozen_lake] [--split val] [--actions 10] [--exact 3]

An outcome reward teaches an action only through the difference that action makes to the return. For every
instance of the split this computes exactly, by dynamic programming over the env's own transitions (one action per
step, `--actions` in all: RAGEN's per-episode budget), the success probability after each possible first action,
followed either by uniformly random actions (what the warm base plays) or by optimal ones. Per env and band of the
solver's optimal move count (and, with `--exact N`, per exact optimal move count up to N: rows `=1`, `=2`, ...) it
prints:

    p          success probability of the continuation's policy from the start (random: first action random too)
    best-avg   max_a Q(s0, a) - mean_a Q(s0, a): what choosing the best first action instead of a random one adds
    std        sqrt(p (1 - p)): the spread of one rollout's 0/1 outcome
    snr        best-avg / std: the signal one rollout's outcome carries about its first action, in standard
               deviations; the rollouts needed to see a given gap grow as 1 / snr^2

Needs `dvc repro envgen` first.
"""

from __future__ import annotations

import argparse
import math
from functools import lru_cache
from typing import Callable, Sequence

from bench_learning import MOVE_BUCKETS, bucket_label  # bench/ is on sys.path when this script runs
from flows.common import read_instances
from ragen.envs.frozen_lake import parse_lake, transition_table
from ragen.envs.solvers import lake_values
from ragen.envs.sokoban import Board, parse_board

Backup = Callable[[Sequence[float]], float]
BACKUPS: dict[str, Backup] = {"random": lambda q: sum(q) / len(q), "optimal": max}


def sokoban_first_action_values(board: Board, actions: int, backup: Backup) -> list[float]:
    """Q(s0, a) for the 4 actions: success within `actions` steps when `backup` plays after the first one."""

    @lru_cache(maxsize=None)
    def value(b: Board, left: int) -> float:
        if b.solved:
            return 1.0
        if left == 0:
            return 0.0
        return backup([value(b.move(a), left - 1) for a in range(4)])

    return [value(board.move(a), actions - 1) for a in range(4)]


def lake_first_action_values(layout: str, actions: int, backup: Backup) -> list[float]:
    """Q(s0, a) for the 4 actions on the slippery transition table (holes and the goal absorb)."""
    lake, player = parse_lake(layout)
    table = transition_table(lake)
    value = lake_values(lake, table, actions - 1, backup)
    return [sum(p * value[nxt] for p, nxt, _, _ in outcomes) for outcomes in table[lake.index(player)]]


FIRST_ACTION_VALUES = {
    "sokoban": lambda state, actions, backup: sokoban_first_action_values(parse_board(state), actions, backup),
    "frozen_lake": lake_first_action_values,
}


def band_of(moves: int | None) -> str:
    """The MOVE_BUCKETS label of an optimal move count; an unsolvable instance (None) goes with the last bucket."""
    return next((bucket_label(lo, hi) for lo, hi in MOVE_BUCKETS
                 if moves is not None and lo <= moves and (hi is None or moves <= hi)), bucket_label(*MOVE_BUCKETS[-1]))


def rows_of(moves: int | None, exact: int) -> list[str]:
    """The rows an instance counts in: its band, its exact move count (`=m`) when m <= `exact`, and `all`."""
    exact_row = [f"={moves}"] if moves is not None and moves <= exact else []
    return [band_of(moves), *exact_row, "all"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", nargs="+", default=["sokoban", "frozen_lake"], choices=sorted(FIRST_ACTION_VALUES))
    parser.add_argument("--split", default="val")
    parser.add_argument("--actions", type=int, default=10)
    parser.add_argument("--envs-dir", default="data/envs")
    parser.add_argument("--exact", type=int, default=0, help="also a row per exact optimal move count up to this")
    args = parser.parse_args()
    print(f"# signal benchmark | split {args.split} | {args.actions} actions, one per step | exact")
    print(f"{'env':<12} {'band':<5} {'n':>4} | {'continuation':<12} {'p':>6} {'best-avg':>8} {'std':>6} {'snr':>6}")
    for env in args.envs:
        table = read_instances(args.envs_dir, env, args.split, ["state", "optimal_moves"])
        rows = []
        for state, moves in zip(table["state"], table["optimal_moves"]):
            per = {}
            for name, backup in BACKUPS.items():
                q = FIRST_ACTION_VALUES[env](state, args.actions, backup)
                mean = sum(q) / len(q)
                per[name] = (mean if name == "random" else max(q), max(q) - mean)
            rows.append((rows_of(moves, args.exact), per))
        exact_rows = [f"={m}" for m in range(1, args.exact + 1)]
        for band in [bucket_label(lo, hi) for lo, hi in MOVE_BUCKETS] + exact_rows + ["all"]:
            chosen = [per for labels, per in rows if band in labels]
            if not chosen:
                continue
            for name in BACKUPS:
                p = sum(per[name][0] for per in chosen) / len(chosen)
                gap = sum(per[name][1] for per in chosen) / len(chosen)
                std = math.sqrt(p * (1 - p))
                snr = f"{gap / std:6.3f}" if std > 0 else f"{'-':>6}"
                print(f"{env:<12} {band:<5} {len(chosen):>4} | {name:<12} {p:6.3f} {gap:8.3f} {std:6.3f} {snr}")


if __name__ == "__main__":
    from entry import run_main

    run_main(main, __file__)
