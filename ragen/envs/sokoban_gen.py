"""Sokoban room generation by reverse play, after gym-sokoban (Schrader, 2018) as RAGEN uses it.

1. Topology: a random walk with direction changes (p = 0.35) stamps small floor masks into a walled room,
   for int(1.7 * (rows + cols)) steps.
2. Targets and the player go on random floor cells; the boxes start on the targets (the solved state).
3. Reverse play: breadth-first search over *pull* moves from the solved state, up to `search_depth` moves. Each
   reached state with every box off its target is scored box_swaps * sum(|box - its target|_1), where box_swaps
   counts how often the pulled box changed along the path; the best-scoring state (ties broken by the seeded rng)
   is the room. Every room is therefore solvable: replaying the pulls forward as pushes solves it.

Deliberate differences from gym-sokoban: breadth-first rather than depth-first reverse search (so the first path
to a state is a shortest one and its score does not depend on recursion order), no final random player walk, and
a failed attempt retries with the same seeded rng instead of reseeding from Python's salted `hash()`.
"""

from __future__ import annotations

import random
from collections import deque

P_CHANGE_DIRECTION = 0.35
MAX_ATTEMPTS = 50
MAX_REVERSE_STATES = 300_000

# 3x3 floor stamps centred on the walker (gym-sokoban's five masks).
MASKS = (
    ((0, 0, 0), (1, 1, 1), (0, 0, 0)),
    ((0, 1, 0), (0, 1, 0), (0, 1, 0)),
    ((0, 0, 0), (1, 1, 0), (0, 1, 0)),
    ((0, 0, 0), (1, 1, 0), (1, 1, 0)),
    ((0, 0, 0), (0, 1, 1), (0, 1, 0)),
)
DIRECTIONS = ((-1, 0), (1, 0), (0, -1), (0, 1))


def carve_topology(rng: random.Random, rows: int, cols: int) -> set[tuple[int, int]]:
    """Floor cells of a room whose border is wall, carved by a random walk."""
    steps = int(1.7 * (rows + cols))
    r, c = rng.randint(1, rows - 2), rng.randint(1, cols - 2)
    dr, dc = rng.choice(DIRECTIONS)
    floor: set[tuple[int, int]] = set()
    for _ in range(steps):
        if rng.random() < P_CHANGE_DIRECTION:
            dr, dc = rng.choice(DIRECTIONS)
        r = min(max(r + dr, 1), rows - 2)
        c = min(max(c + dc, 1), cols - 2)
        mask = rng.choice(MASKS)
        for i in range(3):
            for j in range(3):
                rr, cc = r + i - 1, c + j - 1
                if mask[i][j] and 1 <= rr <= rows - 2 and 1 <= cc <= cols - 2:
                    floor.add((rr, cc))
    return floor


def reverse_play(
    floor: set[tuple[int, int]],
    targets: tuple[tuple[int, int], ...],
    player: tuple[int, int],
    search_depth: int,
    rng: random.Random,
) -> tuple[tuple[tuple[int, int], ...], tuple[int, int]] | None:
    """Best (boxes, player) reachable from the solved state by at most `search_depth` reverse moves, or None.

    Box i starts on targets[i]; a reverse move either walks the player to a free neighbour or pulls the box
    behind the player along with it.
    """
    start = (targets, player)
    # state -> (box_swaps, index of the last pulled box)
    seen: dict[tuple, tuple[int, int]] = {start: (0, -1)}
    frontier = deque([(start, 0)])
    best_score, best = 0, []
    while frontier:
        (boxes, (pr, pc)), depth = frontier.popleft()
        swaps, last_pulled = seen[(boxes, (pr, pc))]
        if not set(boxes) & set(targets):  # every target uncovered
            score = swaps * sum(abs(b[0] - t[0]) + abs(b[1] - t[1]) for b, t in zip(boxes, targets))
            if score > best_score:
                best_score, best = score, [(boxes, (pr, pc))]
            elif score == best_score and score > 0:
                best.append((boxes, (pr, pc)))
        if depth >= search_depth or len(seen) >= MAX_REVERSE_STATES:
            continue
        occupied = set(boxes)
        for dr, dc in DIRECTIONS:
            step_to = (pr + dr, pc + dc)
            if step_to not in floor or step_to in occupied:
                continue
            behind = (pr - dr, pc - dc)
            if behind in occupied:  # pull: the box behind follows the player
                index = boxes.index(behind)
                pulled = boxes[:index] + ((pr, pc),) + boxes[index + 1 :]
                state = (pulled, step_to)
                stats = (swaps + (index != last_pulled), index)
                if state not in seen:
                    seen[state] = stats
                    frontier.append((state, depth + 1))
            state = (boxes, step_to)  # walk without pulling
            if state not in seen:
                seen[state] = (swaps, last_pulled)
                frontier.append((state, depth + 1))
    if not best:
        return None
    return best[rng.randrange(len(best))]


def generate_room(rng: random.Random, *, dim: tuple[int, int], num_boxes: int, search_depth: int):
    """A solvable room drawn from `rng` (a seeded `random.Random`): returns a `sokoban.Board`."""
    from ragen.envs.sokoban import Board

    rows, cols = dim
    for _ in range(MAX_ATTEMPTS):
        floor = carve_topology(rng, rows, cols)
        cells = sorted(floor)
        if len(cells) < num_boxes + 2:
            continue
        picked = rng.sample(cells, num_boxes + 1)
        targets, player = tuple(picked[:num_boxes]), picked[num_boxes]
        found = reverse_play(floor, targets, player, search_depth, rng)
        if found is None:
            continue
        boxes, player = found
        walls = frozenset((r, c) for r in range(rows) for c in range(cols) if (r, c) not in floor)
        return Board(rows, cols, walls, frozenset(targets), frozenset(boxes), player)
    raise RuntimeError(f"no solvable {rows}x{cols} room with {num_boxes} boxes after {MAX_ATTEMPTS} attempts")
