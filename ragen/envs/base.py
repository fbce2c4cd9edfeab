"""The text-environment contract shared by every RAGEN environment.

Gymnasium's signature with text in and text out:
    obs, info = env.reset(seed=s, options=None)
    obs, reward, terminated, truncated, info = env.step("Up")
`info` always carries `action_is_valid`, `action_is_effective` and `success`.

An action that is not an action (unknown name, garbage, a megabyte of text) is reported with
`action_is_valid=False`, reward 0 and no change of state; it never raises and never counts as a step.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

# Longest action text worth looking at: every action name is a short word, every Countdown expression is short.
MAX_ACTION_CHARS = 256


class LayoutError(ValueError):
    """A fixed layout passed with `reset(options={"layout": ...})` cannot be read."""


@dataclass(frozen=True)
class StepInfo:
    """What every step reports besides the observation; `as_dict()` is the Gymnasium `info`."""

    action_is_valid: bool
    action_is_effective: bool
    success: bool

    def as_dict(self) -> dict[str, Any]:
        return {
            "action_is_valid": self.action_is_valid,
            "action_is_effective": self.action_is_effective,
            "success": self.success,
        }


class TextEnv:
    """Base class: the attributes every env sets and the bookkeeping every env shares.

    Subclasses set `tag`, `description` (one line for `ragen envs`), `instruction` (RAGEN's env instruction,
    shown before the first state), `action_names` (None when actions are free text), `max_actions_per_traj`
    (RAGEN's per-episode action budget) and the prompt facts below, and implement `_reset`, `_step`, `render`.
    """

    tag: str = ""
    description: str = ""
    instruction: str = ""
    action_names: tuple[str, ...] | None = None
    max_actions_per_traj: int = 1
    max_turns: int = 5  # RAGEN's max_turn: 5, but 1 for the single-action envs (Bandit, Countdown); see turn_limit
    lists_actions: bool = False  # whether RAGEN's instruction names the actions (Sokoban, FrozenLake)
    grid_vocab: dict[str, str] | None = None  # symbol -> meaning, shown as a legend in the instruction
    # whether the dynamics commute with the grid's symmetries (mirrored, flipped, turned or transposed, the direction
    # actions mapped alike): deterministic grids (Sokoban); algo.symmetry trains on such copies (ragen.symmetry)
    grid_symmetric: bool = False

    def __init__(self) -> None:
        self.rng = random.Random(0)
        self.seed: int | None = None
        self.num_steps = 0
        self.done = True
        self.last_success = False

    def turn_limit(self, max_turns: int) -> int:
        """Turns an episode may take under `rollout.max_turns`: all of them, but one for a single-action env.

        `max_turns` above is RAGEN's default (what the tokenizer's corpus plays), not a cap: 10 turns of one
        action each are 10 turns here.
        """
        return 1 if self.max_turns == 1 else max_turns

    # --- the Gymnasium contract ---
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Start an episode. The same seed gives the same episode in any process (no salted `hash()`)."""
        if seed is None:
            seed = random.SystemRandom().randrange(2**31)
        if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
            raise ValueError(f"{self.tag}: seed must be a non-negative int, got {seed!r}")
        options = dict(options or {})
        unknown = set(options) - {"layout"}
        if unknown:
            raise ValueError(f"{self.tag}: unknown reset option(s) {sorted(unknown)}; the only option is 'layout'")
        self.seed = seed
        self.rng = random.Random(seed)
        self.num_steps = 0
        self.done = False
        self.last_success = False
        self._reset(options.get("layout"))
        return self.render(), StepInfo(True, False, False).as_dict()

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self.done:
            raise RuntimeError(f"{self.tag}: the episode is over (or never started); call reset() first")
        if not isinstance(action, str) or len(action) > MAX_ACTION_CHARS:
            return self.render(), 0.0, False, False, StepInfo(False, False, False).as_dict()
        obs, reward, terminated, truncated, info = self._step(action)
        if info.action_is_valid:
            self.num_steps += 1
        self.done = terminated or truncated
        self.last_success = info.success
        return obs, reward, terminated, truncated, info.as_dict()

    def is_valid_action(self, action: str) -> bool:
        """Whether `step(action)` would accept it, without taking the step."""
        return isinstance(action, str) and len(action) <= MAX_ACTION_CHARS and self.lookup_action(action) is not None

    def lookup_action(self, action: str) -> int | None:
        """The index of a named action, case-insensitive and ignoring surrounding spaces; None if unknown."""
        assert self.action_names is not None
        wanted = action.strip().lower()
        for index, name in enumerate(self.action_names):
            if name.lower() == wanted:
                return index
        return None

    # --- what each env implements ---
    def _reset(self, layout: str | None) -> None:
        raise NotImplementedError

    def _step(self, action: str) -> tuple[str, float, bool, bool, StepInfo]:
        raise NotImplementedError

    def render(self) -> str:
        raise NotImplementedError


def parse_grid(text: str, symbols: dict[str, str], *, env: str, max_side: int = 32) -> list[str]:
    """Split a layout into equal-length rows of known symbols; errors name the row and column (1-based).

    Args:
        text: rows joined by newlines, in the env's own rendering symbols; blank leading/trailing lines
            and trailing spaces are ignored.
        symbols: the symbol -> meaning map of the env.
    """
    if not isinstance(text, str):
        raise LayoutError(f"{env}: layout must be a string, got {type(text).__name__}")
    rows = [line.rstrip() for line in text.strip("\n").split("\n")]
    while rows and not rows[-1]:
        rows.pop()
    if not rows or not rows[0]:
        raise LayoutError(f"{env}: layout is empty")
    if len(rows) > max_side:
        raise LayoutError(f"{env}: layout has {len(rows)} rows; at most {max_side} are supported")
    width = len(rows[0])
    if width > max_side:
        raise LayoutError(f"{env}: row 1 has {width} columns; at most {max_side} are supported")
    known = ", ".join(f"{s!r} {m}" for s, m in symbols.items())
    for r, row in enumerate(rows, start=1):
        if len(row) != width:
            raise LayoutError(f"{env}: row {r} has {len(row)} columns but row 1 has {width}; rows must be equal length")
        for c, ch in enumerate(row, start=1):
            if ch not in symbols:
                raise LayoutError(f"{env}: unknown symbol {ch!r} at row {r}, column {c}; known symbols: {known}")
    return rows
