"""bench/bench_signal.py: exact first-action values against hand-computed cases and the solvers."""

import pytest

from benchload import load_bench
from ragen.envs.solvers import frozen_lake_success_probability, sokoban_min_moves
from ragen.envs.sokoban import parse_board

bench_signal = load_bench("bench_signal")
RANDOM, OPTIMAL = bench_signal.BACKUPS["random"], bench_signal.BACKUPS["optimal"]

ONE_PUSH = "######\n######\n######\n###__#\n#PXO_#\n######"  # Right pushes the box onto its target


def test_sokoban_one_push_by_hand():
    board = parse_board(ONE_PUSH)
    # Up, Down, Left, Right: only Right solves in one action
    assert bench_signal.sokoban_first_action_values(board, 1, OPTIMAL) == [0.0, 0.0, 0.0, 1.0]
    # two actions: a wall bump leaves the player in place, and the random second action is Right w.p. 1/4
    assert bench_signal.sokoban_first_action_values(board, 2, RANDOM) == [0.25, 0.25, 0.25, 1.0]


def test_lake_slip_by_hand():
    # goal to the right of the player; each action goes its way or to either side w.p. 1/3 (Left Down Right Up)
    values = bench_signal.lake_first_action_values("PG\n__", 1, OPTIMAL)
    assert values == pytest.approx([0.0, 1 / 3, 1 / 3, 1 / 3])


def test_optimal_values_match_the_solvers():
    lake = "_G__\nO___\nO___\nP___"
    assert max(bench_signal.lake_first_action_values(lake, 10, OPTIMAL)) == pytest.approx(
        frozen_lake_success_probability(lake, 10))
    board = "######\n#_O_##\n#____#\n#__XP#\n#____#\n######"
    moves = sokoban_min_moves(board)
    values = bench_signal.sokoban_first_action_values(parse_board(board), moves, OPTIMAL)
    assert max(values) == 1.0
    assert max(bench_signal.sokoban_first_action_values(parse_board(board), moves - 1, OPTIMAL)) == 0.0


def test_bands():
    assert [bench_signal.band_of(m) for m in (1, 3, 4, 10, 11, None)] == ["1-3", "1-3", "4-6", "7-10", ">10", ">10"]


def test_exact_rows():
    assert bench_signal.rows_of(2, 3) == ["1-3", "=2", "all"]
    assert bench_signal.rows_of(4, 3) == ["4-6", "all"]
    assert bench_signal.rows_of(None, 3) == [">10", "all"]
    assert bench_signal.rows_of(1, 0) == ["1-3", "all"]
