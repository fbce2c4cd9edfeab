"""FrozenLake as RAGEN plays it: random 4x4 maps, Gymnasium FrozenLake-v1's slippery dynamics, text observations."""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass

from ragen.envs.base import LayoutError, StepInfo, TextEnv, parse_grid

ACTIONS = ("Left", "Down", "Right", "Up")  # Gymnasium's order: LEFT=0, DOWN=1, RIGHT=2, UP=3
MOVES = ((0, -1), (1, 0), (0, 1), (-1, 0))
SYMBOLS = {"P": "player", "_": "frozen", "O": "hole", "G": "goal", "X": "player in hole", "√": "player on goal"}
MAX_STEPS = 100
SLIP_PROBABILITY = 1.0 / 3.0

Pos = tuple[int, int]
# transition[s][a] = [(probability, next_state, reward, terminated)], as in Gymnasium's `P`
Transitions = list[list[list[tuple[float, int, float, bool]]]]


@dataclass(frozen=True)
class LakeMap:
    height: int
    width: int
    holes: frozenset[Pos]
    start: Pos
    goal: Pos

    def index(self, pos: Pos) -> int:
        return pos[0] * self.width + pos[1]

    def position(self, state: int) -> Pos:
        return divmod(state, self.width)

    def is_terminal(self, pos: Pos) -> bool:
        return pos == self.goal or pos in self.holes


def transition_table(lake: LakeMap) -> Transitions:
    """Gymnasium FrozenLake-v1 (is_slippery=True): the intended direction and each perpendicular one w.p. 1/3.

    A move into the edge leaves the player in place. Holes and the goal are absorbing with reward 0.
    """
    table: Transitions = []
    for state in range(lake.height * lake.width):
        pos = lake.position(state)
        per_action = []
        for action in range(4):
            if lake.is_terminal(pos):
                per_action.append([(1.0, state, 0.0, True)])
                continue
            outcomes = []
            for actual in ((action - 1) % 4, action, (action + 1) % 4):
                dr, dc = MOVES[actual]
                r = min(max(pos[0] + dr, 0), lake.height - 1)
                c = min(max(pos[1] + dc, 0), lake.width - 1)
                outcomes.append((SLIP_PROBABILITY, lake.index((r, c)), float((r, c) == lake.goal), lake.is_terminal((r, c))))
            per_action.append(outcomes)
        table.append(per_action)
    return table


def shortest_path_length(lake: LakeMap, start: Pos | None = None) -> int | None:
    """Fewest moves from `start` (default: the start tile) to the goal over frozen tiles if nothing slips
    (breadth-first search); None when no path exists."""
    start = lake.start if start is None else start
    frontier, distance = deque([start]), {start: 0}
    while frontier:
        r, c = frontier.popleft()
        if (r, c) == lake.goal:
            return distance[(r, c)]
        for dr, dc in MOVES:
            nxt = (r + dr, c + dc)
            if 0 <= nxt[0] < lake.height and 0 <= nxt[1] < lake.width and nxt not in distance and nxt not in lake.holes:
                distance[nxt] = distance[(r, c)] + 1
                frontier.append(nxt)
    return None


def has_path(lake: LakeMap) -> bool:
    """Whether the goal can be reached from the start over frozen tiles."""
    return shortest_path_length(lake) is not None


def generate_map(rng: random.Random, size: int = 4, p_frozen: float = 0.8) -> LakeMap:
    """Tiles frozen w.p. `p_frozen`, random distinct start and goal (both frozen), redrawn until a path exists."""
    cells = [(r, c) for r in range(size) for c in range(size)]
    while True:
        holes = {cell for cell in cells if rng.random() >= p_frozen}
        start, goal = rng.sample(cells, 2)
        lake = LakeMap(size, size, frozenset(holes - {start, goal}), start, goal)
        if has_path(lake):
            return lake


def parse_lake(text: str, *, env: str = "frozen_lake") -> tuple[LakeMap, Pos]:
    """Read a start layout ('P' marks the start); errors name the row and column of the problem."""
    rows = parse_grid(text, SYMBOLS, env=env, max_side=16)
    holes, players, goals = set(), [], []
    for r, row in enumerate(rows):
        for c, ch in enumerate(row):
            if ch in ("X", "√"):
                raise LayoutError(
                    f"{env}: {ch!r} at row {r + 1}, column {c + 1} shows a finished episode; "
                    "load a start layout with 'P' on a frozen tile"
                )
            if ch == "O":
                holes.add((r, c))
            elif ch == "P":
                players.append((r, c))
            elif ch == "G":
                goals.append((r, c))
    if len(players) != 1:
        raise LayoutError(f"{env}: a layout needs exactly one player 'P', found {len(players)}")
    if len(goals) != 1:
        raise LayoutError(f"{env}: a layout needs exactly one goal 'G', found {len(goals)}")
    lake = LakeMap(len(rows), len(rows[0]), frozenset(holes), players[0], goals[0])
    return lake, players[0]


def render_lake(lake: LakeMap, player: Pos) -> str:
    rows = []
    for r in range(lake.height):
        row = []
        for c in range(lake.width):
            pos = (r, c)
            if pos == player:
                row.append("X" if pos in lake.holes else "√" if pos == lake.goal else "P")
            else:
                row.append("O" if pos in lake.holes else "G" if pos == lake.goal else "_")
        rows.append("".join(row))
    return "\n".join(rows)


class FrozenLakeEnv(TextEnv):
    """Walk across a slippery frozen lake to the goal without falling into a hole.

    ## Description
    RAGEN's FrozenLake: a 4x4 map whose tiles are frozen with probability 0.8, with a random start and a random
    distinct goal joined by a path; the map is drawn from the reset seed. The ice is slippery exactly as in
    Gymnasium's FrozenLake-v1: the player moves in the intended direction with probability 1/3 and in each of
    the two perpendicular directions with probability 1/3; a move into the edge leaves it in place.

    ## Action Space
    "Left", "Down", "Right", "Up" (case-insensitive). Any other text is not an action.

    ## Observation
    The grid as text: 'P' player, '_' frozen (the start tile too), 'O' hole, 'G' goal, 'X' player in a hole,
    '√' player on the goal.

    ## Rewards
    1 on reaching the goal, 0 otherwise.

    ## Episode End
    Terminated in a hole or at the goal (success); truncated after 100 steps.

    ## Information
    `action_is_effective` is True when the player's position changed (a slip into the edge is not effective).
    `transitions` is the Gymnasium-style table `P[s][a] = [(prob, next_s, reward, terminated)]` that `step`
    samples from.
    """

    tag = "frozen_lake"
    description = "4x4 slippery FrozenLake, random map, start and goal (Gymnasium FrozenLake-v1 dynamics)"
    action_names = ACTIONS
    max_actions_per_traj = 10
    lists_actions = True
    grid_vocab = {"P": "player", "_": "empty", "O": "hole", "G": "goal", "X": "player in hole", "√": "player on goal"}

    def __init__(self) -> None:
        super().__init__()
        self.instruction = (
            "You are solving the FrozenLake puzzle. Forbid the whole and go to the target. You may move to the "
            "unintended direction due to the slippery ice. Example answer format: <think>To forbid the hole and go "
            "to the target, I should go left then go up.</think><answer>Left || Up</answer>"
        )
        self.lake: LakeMap | None = None
        self.player: Pos = (0, 0)
        self.transitions: Transitions = []

    def _reset(self, layout: str | None) -> None:
        if layout is None:
            self.lake = generate_map(self.rng)
            self.player = self.lake.start
        else:
            self.lake, self.player = parse_lake(layout, env=self.tag)
        self.transitions = transition_table(self.lake)

    def _step(self, action: str) -> tuple[str, float, bool, bool, StepInfo]:
        index = self.lookup_action(action)
        if index is None:
            return self.render(), 0.0, False, False, StepInfo(False, False, False)
        outcomes = self.transitions[self.lake.index(self.player)][index]
        draw, cumulative = self.rng.random(), 0.0
        for probability, next_state, reward, terminated in outcomes:
            cumulative += probability
            if draw < cumulative:
                break
        before, self.player = self.player, self.lake.position(next_state)
        success = self.player == self.lake.goal
        truncated = not terminated and self.num_steps + 1 >= MAX_STEPS
        info = StepInfo(True, self.player != before, success)
        return self.render(), reward, terminated, truncated, info

    def render(self) -> str:
        if self.lake is None:
            raise RuntimeError(f"{self.tag}: call reset() before render()")
        return render_lake(self.lake, self.player)
