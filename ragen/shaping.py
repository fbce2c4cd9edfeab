"""Potential-based reward shaping from the exact solvers (`algo.shaping: solver`; not RAGEN's).

Each turn's reward gains
    F_k = c * (Phi(s_{k+1}) - Phi(s_k))
where s_k is the state (with the action and turn budget left) before turn k and c is algo.shaping_coef. A
potential difference leaves the optimal policy unchanged (Ng, Harada and Russell 1999, here with gamma = 1) and over
a whole episode sums to c * (Phi(s_K) - Phi(s_0)); what it adds is credit per turn: with the reward at each turn's
end (algo.reward_placement: turn) a turn is paid for the progress it made, not only for how the episode ended.

The potentials come from the solvers that give each instance's success ceiling:
- Sokoban: Phi(s) = -min(d(s), D), d the fewest actions that solve the puzzle from s (`sokoban_distances`) and D
  the env's action budget per episode (10), which deadlocks (no solution) also get; a solved puzzle has Phi = 0.
- FrozenLake: Phi(s) = W_{a,t}(s), the best probability of reaching the goal with a actions and t turns left under
  the rollout's limits (`ragen.envs.solvers`); a reached goal has Phi = 1 and a hole Phi = 0, so the episode's
  shaping sums to c * (success - W(start)).
Other envs have no state between a first and a last action worth a potential, so `solver` is refused for them.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable

from ragen.envs import ENVS
from ragen.envs.base import TextEnv
from ragen.envs.frozen_lake import FrozenLakeEnv
from ragen.envs.sokoban import Board, SokobanEnv
from ragen.envs.solvers import lake_turn_values, sokoban_distances

# Phi(env, actions_left, turns_left) -> float
Potential = Callable[[TextEnv, int, int], float]
SHAPING_KINDS = ("none", "solver")
_CACHED_PUZZLES = 512  # distance maps kept (one per puzzle; a step plays train.groups puzzles)
_distance_maps: OrderedDict[tuple, dict[tuple, int]] = OrderedDict()


def shapeable(tag: str) -> bool:
    """Whether `algo.shaping: solver` has a potential for this env tag (the Sokoban envs and FrozenLake)."""
    constructor = ENVS.get(tag)
    target = getattr(constructor, "func", constructor)  # functools.partial -> its class
    return isinstance(target, type) and issubclass(target, (SokobanEnv, FrozenLakeEnv))


def sokoban_potential(board: Board, cap: int) -> float:
    """-min(d(board), cap): minus the fewest actions that solve the puzzle, -cap for a deadlock."""
    static = (board.height, board.width, board.walls, board.targets)
    key = (board.player, board.boxes)
    distances = _distance_maps.get(static)
    if distances is None or key not in distances:  # a new puzzle, or a state its first search did not reach
        distances = {**(distances or {}), **sokoban_distances(board)}  # a state's distance is its own: maps merge
        _distance_maps[static] = distances
        while len(_distance_maps) > _CACHED_PUZZLES:
            _distance_maps.popitem(last=False)
    _distance_maps.move_to_end(static)
    distance = distances[key]
    return -float(cap if distance is None else min(distance, cap))


def lake_potential(env: FrozenLakeEnv, actions_left: int, turns_left: int, max_per_turn: int) -> float:
    """W_{actions_left, turns_left}(player): the best success probability from here under the rollout's limits."""
    values = lake_turn_values(env.lake, max(actions_left, 0), max(turns_left, 0), max_per_turn)  # (tiles,)
    return float(values[env.lake.index(env.player)])


def make_potential(kind: str, coef: float, max_per_turn: int) -> Potential | None:
    """The scaled potential c * Phi for `algo.shaping` (None for none); `max_per_turn` is rollout.max_actions_per_turn."""
    if kind == "none":
        return None
    if kind != "solver":
        raise ValueError(f"unknown algo.shaping {kind!r}; use one of {', '.join(SHAPING_KINDS)}")

    def potential(env: TextEnv, actions_left: int, turns_left: int) -> float:
        if isinstance(env, SokobanEnv):
            return coef * sokoban_potential(env.board, env.max_actions_per_traj)
        if isinstance(env, FrozenLakeEnv):
            return coef * lake_potential(env, actions_left, turns_left, max_per_turn)
        raise ValueError(f"algo.shaping solver: env {env.tag!r} has no solver potential (only the Sokoban envs and "
                         "frozen_lake have one); set algo.shaping=none")
    return potential
