"""Exact solvers: optimality on hand-made instances, unsolvable ones, and agreement with the envs."""

import itertools
import random
from fractions import Fraction

import pytest

from ragen.envs import make_env
from ragen.envs.arithmetic import evaluate
from ragen.envs.bandit import Arm
from ragen.envs.frozen_lake import parse_lake, transition_table
from ragen.envs.sokoban import Board, parse_board
from ragen.envs.solvers import (
    bandit_optimal_arm,
    countdown_reachable,
    countdown_solve,
    frozen_lake_success_probability,
    frozen_lake_turn_actions,
    frozen_lake_turn_value,
    lake_values,
    sokoban_distances,
    sokoban_min_moves,
    sokoban_plan,
)


# --- Sokoban ---
@pytest.mark.parametrize(
    "layout, moves",
    [
        ("######\n#PX_O#\n######", 2),  # push, push
        ("#######\n#O_X_P#\n#######", 3),  # walk, push, push
        ("######\n#____#\n#_XP_#\n#_O__#\n######", 3),  # Up, Left, then push Down
    ],
)
def test_sokoban_min_moves_hand_made(layout, moves):
    assert sokoban_min_moves(layout) == moves


def test_sokoban_plan_is_the_shortest_and_replays_to_success():
    layout = "######\n#____#\n#_XP_#\n#_O__#\n######"
    assert sokoban_plan(layout) == ["Up", "Left", "Down"]


def test_sokoban_two_boxes_by_hand():
    # push the right box right twice onto its target, walk round, push the left box up onto its target
    layout = "#######\n#_O___#\n#_XPXO#\n#_____#\n#######"
    # Right (push box onto O at col 5): 1 move; then Down, Left, Left, Up (push left box up onto O): 4 moves
    assert sokoban_min_moves(layout) == 5


@pytest.mark.parametrize(
    "layout",
    [
        "#####\n#X_O#\n#P__#\n#####",  # box stuck in a corner
        "######\n#X___#\n#P__O#\n######",  # box stuck in a corner, target elsewhere
    ],
)
def test_sokoban_unsolvable_is_none(layout):
    assert sokoban_min_moves(layout) is None


def test_sokoban_box_along_a_wall_cannot_leave_it():
    # the box sits against the bottom wall; the target is on the row above: no push can lift it off the wall
    layout = "######\n#__O_#\n#_P__#\n#__X_#\n######"
    assert sokoban_min_moves(layout) is None


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sokoban_distances_agree_with_a_search_from_each_state(seed):
    """Every state reachable from a generated room: its distance is the BFS answer from it (None: unsolvable)."""
    env = make_env("sokoban")
    env.reset(seed=seed)
    distances = sokoban_distances(env.board)
    assert distances[(env.board.player, env.board.boxes)] == sokoban_min_moves(env.board)
    checked = {None: 0, "solvable": 0}
    for (player, boxes), distance in distances.items():
        board = Board(env.board.height, env.board.width, env.board.walls, env.board.targets, boxes, player)
        assert distance == sokoban_min_moves(board)
        checked[None if distance is None else "solvable"] += 1
    assert checked["solvable"] > 5 and checked[None] > 5


def test_sokoban_distances_by_hand():
    board = parse_board("######\n#____#\n#_XP_#\n#_O__#\n######")
    distances = sokoban_distances(board)
    assert distances[(board.player, board.boxes)] == 3
    assert distances[((2, 2), frozenset({(2, 1)}))] is None  # Left pinned the box to the wall: a deadlock
    assert distances[((1, 2), frozenset({(2, 2)}))] == 1  # one push down
    assert sokoban_distances(parse_board("#####\n#X_O#\n#P__#\n#####")) == {
        ((2, 1), frozenset({(1, 1)})): None, ((2, 2), frozenset({(1, 1)})): None, ((2, 3), frozenset({(1, 1)})): None,
        ((1, 2), frozenset({(1, 1)})): None, ((1, 3), frozenset({(1, 1)})): None}


def test_sokoban_vocab_layouts_are_solved_too():
    assert sokoban_min_moves("WWWWWW\nWAB.GW\nWWWWWW") == 2


def _solves_within(board, depth):
    for actions in itertools.product(range(4), repeat=depth):
        b = board
        for a in actions:
            b = b.move(a)
            if b.solved:
                return True
    return False


SHORT_SEEDS = [s for s in range(40) if len(sokoban_plan(make_env("sokoban").reset(seed=s)[0])) <= 7][:12]


@pytest.mark.parametrize("seed", SHORT_SEEDS)
def test_sokoban_bfs_is_optimal_against_brute_force(seed):
    """No action sequence shorter than the BFS answer solves a generated room; the BFS plan does."""
    env = make_env("sokoban")
    obs, _ = env.reset(seed=seed)
    plan = sokoban_plan(obs)
    board = parse_board(obs)
    assert not _solves_within(board, len(plan) - 1)
    for action in plan:
        obs, reward, terminated, _, info = env.step(action)
    assert terminated and info["success"]


# --- FrozenLake ---
@pytest.mark.parametrize("k", range(6))
def test_frozen_lake_probability_by_hand(k):
    # "PG": each step reaches the goal w.p. 1/3 (intended Right); the two perpendicular moves hit the edge
    assert frozen_lake_success_probability("PG", k) == pytest.approx(1 - (2 / 3) ** k)


def test_frozen_lake_probability_with_a_hole_by_hand():
    # 2x2: P top-left, hole top-right, goal bottom-left. Action Down: goal w.p. 1/3, Left-slip stays (1/3),
    # Right-slip into the hole (1/3). Action Left: stay (Left edge) 1/3, Down -> goal 1/3, Up edge stay 1/3.
    # Left is better (no hole): per step 1/3 success, 2/3 stay -> 1 - (2/3)^k.
    assert frozen_lake_success_probability("PO\nG_", 1) == pytest.approx(1 / 3)
    assert frozen_lake_success_probability("PO\nG_", 3) == pytest.approx(1 - (2 / 3) ** 3)


@pytest.mark.parametrize("k", range(6))
def test_lake_values_under_random_play_by_hand(k):
    # "PG" under uniformly random actions: Left (Up, Left or Down) never leaves the tile; Down, Right and Up each
    # slip Right w.p. 1/3, so a random action reaches the goal w.p. (0 + 3 * 1/3) / 4 = 1/4 and stays otherwise
    lake, player = parse_lake("PG")
    mean = lambda q: sum(q) / len(q)  # noqa: E731
    assert lake_values(lake, transition_table(lake), k, mean)[lake.index(player)] == pytest.approx(1 - (3 / 4) ** k)
    assert lake_values(lake, transition_table(lake), k)[lake.index(player)] == pytest.approx(1 - (2 / 3) ** k)


def test_frozen_lake_unreachable_goal_is_zero():
    assert frozen_lake_success_probability("POG", 10) == 0.0


def test_frozen_lake_turn_plan_by_hand():
    # "PG": Right, Down and Up each reach the goal w.p. 1/3 (directly or by a slip) and otherwise stay; Left
    # never does. Blind and closed-loop play are worth the same: two actions in one turn or in two, 1 - (2/3)^2
    assert frozen_lake_turn_value("PG", 2, 1, 2) == pytest.approx(5 / 9)
    first = frozen_lake_turn_actions("PG", 2, 1, 2)
    assert len(first) == 2 and "Left" not in first
    assert frozen_lake_turn_value("PG", 2, 2, 2) == pytest.approx(5 / 9)
    assert len(frozen_lake_turn_actions("PG", 2, 2, 2)) == 1  # the tie goes to the shorter turn
    assert frozen_lake_turn_value("PG", 5, 2, 1) == pytest.approx(5 / 9)  # one action per turn: turns bind
    assert frozen_lake_turn_value("POG", 10, 5, 5) == 0.0


def _best_blind_sequence(lake, state, length):
    """Slow oracle: max over every action sequence of 1..length actions of P(goal), by exact enumeration."""
    table, goal, best = transition_table(lake), lake.index(lake.goal), 0.0
    for k in range(1, length + 1):
        for sequence in itertools.product(range(4), repeat=k):
            dist = {state: 1.0}
            for a in sequence:
                nxt = {}
                for s, p in dist.items():
                    for q, s2, _, _ in table[s][a]:
                        nxt[s2] = nxt.get(s2, 0.0) + p * q
                dist = nxt
            best = max(best, dist.get(goal, 0.0))
    return best


def test_frozen_lake_turn_value_matches_enumeration_and_value_iteration():
    env = make_env("frozen_lake")
    for seed in range(5):
        obs, _ = env.reset(seed=seed)
        lake, player = parse_lake(obs)
        # one turn: the best blind sequence; one action per turn: closed-loop value iteration over min(a, t) steps
        assert frozen_lake_turn_value(obs, 3, 1, 3) == pytest.approx(_best_blind_sequence(lake, lake.index(player), 3))
        assert frozen_lake_turn_value(obs, 10, 4, 1) == pytest.approx(frozen_lake_success_probability(obs, 4))
        # looking again can only help: blind turns sit between one action per turn and closed loop
        assert (frozen_lake_success_probability(obs, 5) - 1e-12 <= frozen_lake_turn_value(obs, 10, 5, 5)
                <= frozen_lake_success_probability(obs, 10) + 1e-12)


def _greedy_policy(lake, horizon):
    """policy[k][s]: the action that maximises success with k steps left (the VI argmax)."""
    table = transition_table(lake)
    goal = lake.index(lake.goal)
    value = [float(s == goal) for s in range(len(table))]
    policy = []
    for _ in range(horizon):
        q = [[sum(p * value[n] for p, n, _, _ in table[s][a]) for a in range(4)] for s in range(len(table))]
        policy.append([max(range(4), key=lambda a: q[s][a]) for s in range(len(table))])
        value = [1.0 if s == goal else 0.0 if lake.is_terminal(lake.position(s)) else max(q[s]) for s in range(len(table))]
    return policy  # policy[k - 1] is for k steps left


def test_frozen_lake_value_matches_simulated_optimal_policy():
    env = make_env("frozen_lake")
    obs, _ = env.reset(seed=2024)
    value = frozen_lake_success_probability(obs, 10)
    lake, _ = parse_lake(obs)
    policy = _greedy_policy(lake, 10)
    names = ["Left", "Down", "Right", "Up"]
    n, wins = 4000, 0
    for seed in range(n):
        env.reset(seed=seed, options={"layout": obs})
        for left in range(10, 0, -1):
            _, _, terminated, _, info = env.step(names[policy[left - 1][lake.index(env.player)]])
            if terminated:
                wins += info["success"]
                break
    sigma = (value * (1 - value) / n) ** 0.5
    assert abs(wins / n - value) < 4 * sigma + 1e-9


def test_frozen_lake_value_bounds_a_random_policy():
    env = make_env("frozen_lake")
    obs, _ = env.reset(seed=5)
    value = frozen_lake_success_probability(obs, 10)
    rng, wins, n = random.Random(0), 0, 3000
    for seed in range(n):
        env.reset(seed=seed, options={"layout": obs})
        for _ in range(10):
            _, _, terminated, _, info = env.step(rng.choice(["Left", "Down", "Right", "Up"]))
            if terminated:
                wins += info["success"]
                break
    assert wins / n <= value + 4 * (value * (1 - value) / n) ** 0.5


# --- Bandit ---
def test_bandit_optimal_arm():
    assert bandit_optimal_arm([Arm("Phoenix", 0.1, 1.0), Arm("Dragon", 1.0, 0.25)]) == ("Dragon", 0.25)
    assert bandit_optimal_arm(make_env("bandit_rev").arms) == ("Phoenix", 0.25)


# --- Countdown ---
def test_countdown_solution_uses_each_number_once_and_hits_the_target():
    for nums, target in [([3, 5, 2], 16), ([6, 4, 2], 3), ([25, 50, 75, 100], 100), ([1, 2, 3, 4], 24)]:
        solution = countdown_solve(nums, target)
        value, used = evaluate(solution)
        assert value == target and sorted(used) == sorted(nums)


def test_countdown_unreachable_is_none():
    assert countdown_solve([1, 1, 1], 99) is None
    assert countdown_solve([2, 3], 7) is None


def test_countdown_reachable_by_hand():
    # two numbers 2, 3: 5, 6, -1, 1, 2/3, 3/2
    assert set(countdown_reachable([2, 3])) == {Fraction(5), Fraction(6), Fraction(-1), Fraction(1), Fraction(2, 3), Fraction(3, 2)}
