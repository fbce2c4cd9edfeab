"""RAGEN's text environments. `make_env(tag)` builds one; `ENVS` maps every tag to its constructor."""

from __future__ import annotations

from functools import partial
from typing import Callable

from ragen.envs.bandit import BanditEnv
from ragen.envs.base import LayoutError, TextEnv
from ragen.envs.countdown import CountdownEnv
from ragen.envs.frozen_lake import FrozenLakeEnv
from ragen.envs.sokoban import VOCAB_SYMBOLS, SokobanEnv

ENVS: dict[str, Callable[[], TextEnv]] = {
    "bandit": partial(
        BanditEnv, tag="bandit", safe_name="Phoenix", risky_name="Dragon",
        description="two-armed bandit, arms Phoenix (safe 0.1) and Dragon (risky: 1.0 w.p. 0.25), single turn",
    ),
    "bandit_test": partial(
        BanditEnv, tag="bandit_test", safe_name="Trader", risky_name="Librarian",
        description="bandit with unseen arm names: Trader (safe) and Librarian (risky), for generalisation",
    ),
    "bandit_rev": partial(
        BanditEnv, tag="bandit_rev", safe_name="Dragon", risky_name="Phoenix",
        description="bandit with reversed name semantics: Dragon is safe, Phoenix is risky",
    ),
    "sokoban": partial(
        SokobanEnv, tag="sokoban", dim=(6, 6), num_boxes=1, search_depth=300,
        description="Sokoban 6x6, one box (RAGEN's SimpleSokoban)",
    ),
    "sokoban_large": partial(
        SokobanEnv, tag="sokoban_large", dim=(8, 8), num_boxes=2, search_depth=10,
        description="Sokoban 8x8, two boxes (RAGEN's LargerSokoban), for generalisation",
    ),
    "sokoban_vocab": partial(
        SokobanEnv, tag="sokoban_vocab", dim=(6, 6), num_boxes=1, search_depth=30, symbols=VOCAB_SYMBOLS,
        description="Sokoban 6x6, one box, drawn with other symbols W . G C B A @ (RAGEN's DifferentGridVocab)",
    ),
    "frozen_lake": FrozenLakeEnv,
    "countdown": CountdownEnv,
}


def make_env(tag: str) -> TextEnv:
    """A fresh environment for `tag`; an unknown tag is an error that lists the known ones."""
    if tag not in ENVS:
        raise KeyError(f"unknown env tag {tag!r}; known tags: {', '.join(ENVS)}")
    return ENVS[tag]()


def grid_symmetric(tag: str) -> bool:
    """Whether env `tag` declares dynamics that commute with its grid's symmetries (TextEnv.grid_symmetric), without
    building one; False for an unknown tag."""
    constructor = ENVS.get(tag)
    return bool(getattr(getattr(constructor, "func", constructor), "grid_symmetric", False))


__all__ = ["ENVS", "LayoutError", "TextEnv", "grid_symmetric", "make_env"]
