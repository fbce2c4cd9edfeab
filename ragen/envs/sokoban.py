"""Sokoban as RAGEN plays it: gym-sokoban's push rules and rewards, text observations, reverse-play rooms."""

from __future__ import annotations

from dataclasses import dataclass

from ragen.envs.base import LayoutError, StepInfo, TextEnv, parse_grid
from ragen.envs.sokoban_gen import generate_room

# Cell roles, in a fixed order, so a symbol set is a tuple of seven characters.
ROLES = ("wall", "empty", "target", "box_on_target", "box", "player", "player_on_target")
DEFAULT_SYMBOLS = ("#", "_", "O", "√", "X", "P", "S")
VOCAB_SYMBOLS = ("W", ".", "G", "C", "B", "A", "@")

ACTIONS = ("Up", "Down", "Left", "Right")
MOVES = ((-1, 0), (1, 0), (0, -1), (0, 1))  # (d_row, d_col) per action, same order

STEP_PENALTY = -0.1
BOX_ON_TARGET_REWARD = 1.0
BOX_OFF_TARGET_PENALTY = -1.0
SOLVED_REWARD = 10.0
MAX_STEPS = 100

Pos = tuple[int, int]


@dataclass(frozen=True)
class Board:
    """A Sokoban position: static cells plus the movable player and boxes."""

    height: int
    width: int
    walls: frozenset[Pos]
    targets: frozenset[Pos]
    boxes: frozenset[Pos]
    player: Pos

    def is_free(self, pos: Pos) -> bool:
        """Inside the grid, not a wall, not a box. Out-of-bounds counts as wall."""
        r, c = pos
        inside = 0 <= r < self.height and 0 <= c < self.width
        return inside and pos not in self.walls and pos not in self.boxes

    def move(self, action: int) -> Board:
        """gym-sokoban's "push <dir>": push an adjacent box if the cell beyond is free, else walk if free."""
        dr, dc = MOVES[action]
        r, c = self.player
        ahead = (r + dr, c + dc)
        if ahead in self.boxes:
            beyond = (r + 2 * dr, c + 2 * dc)
            if not self.is_free(beyond):
                return self
            boxes = (self.boxes - {ahead}) | {beyond}
            return Board(self.height, self.width, self.walls, self.targets, frozenset(boxes), ahead)
        if self.is_free(ahead):
            return Board(self.height, self.width, self.walls, self.targets, self.boxes, ahead)
        return self

    @property
    def boxes_on_target(self) -> int:
        return len(self.boxes & self.targets)

    @property
    def solved(self) -> bool:
        return self.boxes == self.targets


def render_board(board: Board, symbols: tuple[str, ...] = DEFAULT_SYMBOLS) -> str:
    wall, empty, target, box_on_target, box, player, player_on_target = symbols
    rows = []
    for r in range(board.height):
        row = []
        for c in range(board.width):
            pos = (r, c)
            on_target = pos in board.targets
            if pos in board.walls:
                row.append(wall)
            elif pos == board.player:
                row.append(player_on_target if on_target else player)
            elif pos in board.boxes:
                row.append(box_on_target if on_target else box)
            else:
                row.append(target if on_target else empty)
        rows.append("".join(row))
    return "\n".join(rows)


def parse_board(text: str, symbols: tuple[str, ...] = DEFAULT_SYMBOLS, *, env: str = "sokoban") -> Board:
    """Read a layout written in `symbols`; errors name the row and column of the problem."""
    rows = parse_grid(text, dict(zip(symbols, ROLES)), env=env)
    role_of = dict(zip(symbols, ROLES))
    walls, targets, boxes, players = set(), set(), set(), []
    for r, row in enumerate(rows):
        for c, ch in enumerate(row):
            role = role_of[ch]
            if role == "wall":
                walls.add((r, c))
            if role in ("target", "box_on_target", "player_on_target"):
                targets.add((r, c))
            if role in ("box", "box_on_target"):
                boxes.add((r, c))
            if role in ("player", "player_on_target"):
                players.append((r, c))
    if len(players) != 1:
        where = ", ".join(f"row {r + 1}, column {c + 1}" for r, c in players) or "nowhere"
        raise LayoutError(f"{env}: a layout needs exactly one player, found {len(players)} ({where})")
    if not boxes:
        raise LayoutError(f"{env}: a layout needs at least one box")
    if len(boxes) != len(targets):
        raise LayoutError(f"{env}: {len(boxes)} boxes but {len(targets)} targets; the counts must match")
    return Board(len(rows), len(rows[0]), frozenset(walls), frozenset(targets), frozenset(boxes), players[0])


class SokobanEnv(TextEnv):
    """Push every box onto a target.

    ## Description
    RAGEN's SimpleSokoban family, with gym-sokoban's dynamics. Rooms are generated from the solved state by
    reverse play (pulling boxes off their targets), so every generated room is solvable.

    ## Action Space
    "Up", "Down", "Left", "Right" (case-insensitive). A move walks into a free cell; walking into a box pushes it
    when the cell beyond it is free. Moving into a wall, or pushing a box into a wall or another box, does nothing
    but still costs a step (`action_is_effective` False). Any other text is not an action.

    ## Observation
    The grid as text, rows joined by newlines. Default symbols: '#' wall, '_' empty, 'O' target,
    '√' box on target, 'X' box, 'P' player, 'S' player on target. `sokoban_vocab` uses W . G C B A @ instead.

    ## Rewards
    -0.1 per action; +1 when a box is pushed onto a target, -1 when one is pushed off; +10 when all boxes are
    on targets (a one-box win push pays 10.9).

    ## Episode End
    Terminated when every box is on a target (success); truncated after 100 steps.

    ## Arguments
    dim (rows, cols), num_boxes, search_depth (reverse-play depth: smaller gives easier rooms), symbols.
    """

    action_names = ACTIONS
    max_actions_per_traj = 10
    lists_actions = True
    grid_symmetric = True

    def __init__(
        self,
        *,
        tag: str = "sokoban",
        dim: tuple[int, int] = (6, 6),
        num_boxes: int = 1,
        search_depth: int = 300,
        symbols: tuple[str, ...] = DEFAULT_SYMBOLS,
        description: str = "",
    ) -> None:
        super().__init__()
        self.tag = tag
        self.dim = dim
        self.num_boxes = num_boxes
        self.search_depth = search_depth
        self.symbols = symbols
        self.description = description
        self.instruction = (
            "You are solving the Sokoban puzzle. You are the player and you need to push all boxes to targets. "
            "When you are right next to a box, you can push it by moving in the same direction. You cannot push a "
            "box through a wall, and you cannot pull a box. The answer should be a sequence of actions, like "
            "<answer>Right || Right || Up</answer>"
        )
        self.board: Board | None = None

    @property
    def grid_vocab(self) -> dict[str, str]:
        """Symbol -> meaning for the prompt's legend, in this env's own symbols.

        RAGEN builds the legend from the default symbols even for its DifferentGridVocab env (a quirk); here the
        legend always describes the symbols the grid actually uses.
        """
        meanings = ("wall", "empty", "target", "box on target", "box", "player", "player on target")
        return dict(zip(self.symbols, meanings))

    def _reset(self, layout: str | None) -> None:
        if layout is None:
            self.board = generate_room(self.rng, dim=self.dim, num_boxes=self.num_boxes, search_depth=self.search_depth)
        else:
            self.board = parse_board(layout, self.symbols, env=self.tag)
            if self.board.solved:
                raise LayoutError(f"{self.tag}: the layout is already solved; give a layout with a box off target")

    def _step(self, action: str) -> tuple[str, float, bool, bool, StepInfo]:
        index = self.lookup_action(action)
        if index is None:
            return self.render(), 0.0, False, False, StepInfo(False, False, False)
        before = self.board
        after = before.move(index)
        reward = STEP_PENALTY
        if after.boxes_on_target > before.boxes_on_target:
            reward += BOX_ON_TARGET_REWARD
        elif after.boxes_on_target < before.boxes_on_target:
            reward += BOX_OFF_TARGET_PENALTY
        if after.solved:
            reward += SOLVED_REWARD
        self.board = after
        terminated = after.solved
        truncated = not terminated and self.num_steps + 1 >= MAX_STEPS
        info = StepInfo(True, after.player != before.player, after.solved)
        return self.render(), reward, terminated, truncated, info

    def render(self) -> str:
        if self.board is None:
            raise RuntimeError(f"{self.tag}: call reset() before render()")
        return render_board(self.board, self.symbols)
