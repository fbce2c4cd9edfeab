"""Exact solvers: the best any policy can do on an instance, which is its success ceiling.

- Sokoban: breadth-first search over (player, boxes) states; every action costs one, so the first time the
  solved state is popped gives the fewest actions (moves and pushes both count).
- FrozenLake: finite-horizon value iteration on the slippery transition table,
      V_0(s) = 1[s = goal],   V_k(s) = 1[s = goal] + 1[s non-terminal] * max_a sum_s' P(s'|s,a) V_{k-1}(s'),
  so V_k(start) is the optimal probability of reaching the goal within k actions. Under the rollout's limits
  (t turns, up to K actions per turn played blind, a actions in all) the same recursion runs over turns,
      W_{a,t}(s) = 1[s = goal] if s is terminal, a = 0 or t = 0, else
                   max_{1 <= k <= min(K, a)} max_{q in A^k} sum_s' D_q(s, s') W_{a-k, t-1}(s'),
  with D_q = P_{q_1} ... P_{q_k} the transition matrix of the action sequence q (terminal tiles absorb).
- Bandit: the arm with the highest expected reward.
- Countdown: exhaustive search over every way of combining the numbers pairwise with + - * /.
"""

from __future__ import annotations

from collections import deque
from fractions import Fraction
from functools import lru_cache
from typing import Callable, Sequence

import torch

from ragen.envs.bandit import Arm
from ragen.envs.frozen_lake import ACTIONS as LAKE_ACTIONS
from ragen.envs.frozen_lake import parse_lake, transition_table
from ragen.envs.sokoban import ACTIONS as SOKOBAN_ACTIONS
from ragen.envs.sokoban import DEFAULT_SYMBOLS, VOCAB_SYMBOLS, Board, parse_board

MAX_SOKOBAN_STATES = 2_000_000


# --- Sokoban ---
def _pick_symbols(layout: str) -> tuple[str, ...]:
    """The symbol set (default or `sokoban_vocab`) that covers more of the layout's characters."""
    chars = set(layout) - {"\n", " "}
    return max((DEFAULT_SYMBOLS, VOCAB_SYMBOLS), key=lambda symbols: len(chars & set(symbols)))


def sokoban_plan(layout: str | Board, max_states: int = MAX_SOKOBAN_STATES) -> list[str] | None:
    """A shortest action sequence that solves the layout, or None when no sequence solves it.

    Raises RuntimeError if the search needs more than `max_states` states (too big to decide exactly).
    """
    board = layout if isinstance(layout, Board) else parse_board(layout, _pick_symbols(layout))
    start = (board.player, board.boxes)
    parents: dict[tuple, tuple[tuple, int] | None] = {start: None}
    frontier = deque([board])
    while frontier:
        current = frontier.popleft()
        if current.solved:
            plan, key = [], (current.player, current.boxes)
            while parents[key] is not None:
                key, action = parents[key]
                plan.append(SOKOBAN_ACTIONS[action])
            return plan[::-1]
        for action in range(4):
            nxt = current.move(action)
            key = (nxt.player, nxt.boxes)
            if key not in parents:
                parents[key] = ((current.player, current.boxes), action)
                frontier.append(nxt)
        if len(parents) > max_states:
            raise RuntimeError(f"sokoban: search exceeded {max_states} states; the layout is too large to solve exactly")
    return None


def sokoban_distances(board: Board, max_states: int = MAX_SOKOBAN_STATES) -> dict[tuple, int | None]:
    """The fewest actions to the solved state from every state reachable from `board`, keyed by (player, boxes).

    A breadth-first search forward collects the reachable states and their moves; a second one backwards from the
    solved states over the reversed moves gives each state's distance,
        d(s) = 0 if s is solved, else 1 + min over actions a of d(move(s, a)).
    A state from which no sequence solves the puzzle (a deadlock) maps to None. Raises RuntimeError past `max_states`.
    """
    start = (board.player, board.boxes)
    predecessors: dict[tuple, set[tuple]] = {start: set()}
    solved, frontier = [], deque([board])
    while frontier:
        current = frontier.popleft()
        key = (current.player, current.boxes)
        if current.solved:
            solved.append(key)
            continue  # the episode ends here: nothing follows a solved state
        for action in range(4):
            nxt = current.move(action)
            nxt_key = (nxt.player, nxt.boxes)
            if nxt_key not in predecessors:
                predecessors[nxt_key] = set()
                frontier.append(nxt)
            predecessors[nxt_key].add(key)
        if len(predecessors) > max_states:
            raise RuntimeError(f"sokoban: search exceeded {max_states} states; the layout is too large to solve exactly")
    distance: dict[tuple, int | None] = {key: 0 for key in solved}
    backward = deque(solved)
    while backward:
        key = backward.popleft()
        for before in predecessors[key]:
            if before not in distance:
                distance[before] = distance[key] + 1
                backward.append(before)
    return {key: distance.get(key) for key in predecessors}


def sokoban_min_moves(layout: str | Board) -> int | None:
    """The fewest actions (moves and pushes both count) that solve the layout; None when it cannot be solved."""
    plan = sokoban_plan(layout)
    return None if plan is None else len(plan)


# --- FrozenLake ---
def lake_values(lake, table, steps: int, backup: Callable[[Sequence[float]], float] = max) -> list[float]:
    """V_steps(s) for every state: the probability of reaching the goal within `steps` actions when each step's
    action values are combined by `backup` (max: the optimal policy; a mean: uniformly random actions)."""
    goal = lake.index(lake.goal)
    value = [float(s == goal) for s in range(len(table))]
    for _ in range(steps):
        value = [
            1.0 if s == goal
            else backup([sum(p * value[nxt] for p, nxt, _, _ in outcomes) for outcomes in table[s]])
            if not lake.is_terminal(lake.position(s)) else 0.0
            for s in range(len(table))
        ]
    return value


def frozen_lake_success_probability(layout: str, max_steps: int) -> float:
    """The optimal probability of reaching the goal within `max_steps` actions from the player's tile.

    Finite-horizon value iteration (see the module docstring) on the same table `FrozenLakeEnv.step` samples.
    """
    lake, player = parse_lake(layout)
    return lake_values(lake, transition_table(lake), max_steps)[lake.index(player)]


@lru_cache(maxsize=32)
def _sequence_matrices(lake, max_len: int) -> tuple[torch.Tensor, ...]:
    """D[k]: (4^k, n, n) transition matrices of every action sequence of length k, index q = sum_i q_i 4^(k-1-i)."""
    table = transition_table(lake)
    n = len(table)
    step = torch.zeros(4, n, n, dtype=torch.float64)  # (A, n, n): P(s' | s, a)
    for s, per_action in enumerate(table):
        for a, outcomes in enumerate(per_action):
            for p, nxt, _, _ in outcomes:
                step[a, s, nxt] += p
    matrices = [torch.eye(n, dtype=torch.float64)[None]]  # (1, n, n)
    for _ in range(max_len):
        matrices.append(torch.einsum("qij,ajk->qaik", matrices[-1], step).reshape(-1, n, n))  # (4^k, n, n)
    return tuple(matrices)


@lru_cache(maxsize=4096)
def lake_turn_values(lake, actions: int, turns: int, max_per_turn: int) -> torch.Tensor:
    """W_{actions, turns}: (n,) over every tile (module docstring), cached per lake and budget."""
    n = lake.height * lake.width
    goal = torch.tensor([float(s == lake.index(lake.goal)) for s in range(n)], dtype=torch.float64)  # (n,)
    if actions == 0 or turns == 0:
        return goal
    matrices = _sequence_matrices(lake, max_per_turn)
    best = torch.stack([(matrices[k] @ lake_turn_values(lake, actions - k, turns - 1, max_per_turn)).max(0).values
                        for k in range(1, min(max_per_turn, actions) + 1)]).max(0).values  # (4^k, n) -> (n,)
    terminal = torch.tensor([lake.is_terminal(lake.position(s)) for s in range(n)])
    return torch.where(terminal, goal, best)


def frozen_lake_turn_value(layout: str, actions: int, turns: int, max_per_turn: int) -> float:
    """W_{actions, turns}(player): the best success probability under the rollout's limits (module docstring)."""
    lake, player = parse_lake(layout)
    return float(lake_turn_values(lake, actions, turns, max_per_turn)[lake.index(player)])


def frozen_lake_turn_actions(layout: str, actions: int, turns: int, max_per_turn: int) -> list[str]:
    """The actions of this turn on an optimal policy for W_{actions, turns}: the best blind sequence of 1 to
    min(max_per_turn, actions) actions, the shortest among equally good ones (the next turn sees where it slid)."""
    lake, player = parse_lake(layout)
    if lake.is_terminal(player) or actions <= 0 or turns <= 0:
        raise ValueError("frozen_lake: no turn to plan (player on a terminal tile, or no actions or turns left)")
    matrices, state = _sequence_matrices(lake, max_per_turn), lake.index(player)
    best = (-1.0, 0, 0)
    for k in range(1, min(max_per_turn, actions) + 1):  # ascending k: ties keep the shorter turn
        q_values = matrices[k][:, state] @ lake_turn_values(lake, actions - k, turns - 1, max_per_turn)  # (4^k,)
        q = int(q_values.argmax())
        if float(q_values[q]) > best[0] + 1e-12:
            best = (float(q_values[q]), k, q)
    _, k, q = best
    return [LAKE_ACTIONS[(q // 4 ** (k - 1 - i)) % 4] for i in range(k)]


# --- Bandit ---
def bandit_optimal_arm(arms: Sequence[Arm]) -> tuple[str, float]:
    """The arm with the highest expected reward and that expectation."""
    best = max(arms, key=lambda arm: arm.expected_reward)
    return best.name, best.expected_reward


# --- Countdown ---
def _combine(items: tuple[tuple[Fraction, str], ...], found: dict[Fraction, str], seen: set) -> None:
    """Record every value reachable by combining all `items` pairwise (each used exactly once)."""
    key = tuple(sorted(value for value, _ in items))
    if key in seen:
        return
    seen.add(key)
    if len(items) == 1:
        value, text = items[0]
        found.setdefault(value, text)
        return
    for i in range(len(items)):
        for j in range(i + 1, len(items)):
            (a, ta), (b, tb) = items[i], items[j]
            rest = items[:i] + items[i + 1 : j] + items[j + 1 :]
            options = [(a + b, f"({ta} + {tb})"), (a * b, f"({ta} * {tb})"), (a - b, f"({ta} - {tb})"), (b - a, f"({tb} - {ta})")]
            if b != 0:
                options.append((a / b, f"({ta} / {tb})"))
            if a != 0:
                options.append((b / a, f"({tb} / {ta})"))
            for option in options:
                _combine(rest + (option,), found, seen)


def countdown_reachable(nums: Sequence[int]) -> dict[Fraction, str]:
    """Every value an expression using each number exactly once can take, with one such expression."""
    return dict(_reachable(tuple(nums)))


@lru_cache(maxsize=64)
def _reachable(nums: tuple[int, ...]) -> tuple[tuple[Fraction, str], ...]:
    found: dict[Fraction, str] = {}
    _combine(tuple((Fraction(n), str(n)) for n in nums), found, set())
    return tuple((value, _strip_outer(text)) for value, text in found.items())


def countdown_solve(nums: Sequence[int], target: int) -> str | None:
    """One expression that uses each number exactly once and equals `target`, or None if none exists."""
    return countdown_reachable(nums).get(Fraction(target))


def _strip_outer(text: str) -> str:
    if text.startswith("(") and text.endswith(")"):
        depth = 0
        for i, ch in enumerate(text):
            depth += ch == "("
            depth -= ch == ")"
            if depth == 0 and i < len(text) - 1:
                return text
        return text[1:-1]
    return text
