"""Copies of trajectories under the symmetries of a grid (`algo.symmetry`; not RAGEN's).

A Sokoban room mirrored left to right is another room, and the same play mirrored (every state mirrored, Left and
Right swapped in every response, thoughts included) is a play of it with the same rewards turn by turn; likewise
upside down (Up and Down swapped), turned a quarter (Up becomes Right, Right Down, ...), or reflected in a diagonal.
Each kept trajectory of a step can so be trained on together with its copies, which share its score (its
normalised return):

    copies(tau) = {g(tau) : g in G},   G = {mirror} | {flip} | C4 less the identity (rotate) | D4 less it (orbit)

Why: a copy carries its original's outcome with the directions exchanged. Under rotate and orbit each direction goes
to every other one equally often, so on a bias b shared by all rooms (the drift of the opening towards one direction,
the template collapse of bench/RESULTS.md) the copies' policy gradients sum to
    A * sum_g (e_{g(a)} - pi(. | g(x))) = A * (|G| / 4 * 1 - sum_g pi(. | g(x)))
(the all-ones part changes no probability): none of the outcome's push lands on one direction, and what is left pulls
a template opening back towards the others; what depends on the room adds up.
The copies are not samples of the policy: the PPO ratio of a copy is taken against the policy's re-scored
log-probs of the copy (its old log-probs; the sampler never drew it), so `algo.old_logprobs` must be rescore. A copy
can hold tokens the policy finds very unlikely (its re-tokenised text is not what the policy would write), whose ratio
can then grow by orders of magnitude in a later mini-batch of the same step; `algo.dual_clip` bounds the loss of those
with a negative advantage.

Copies are replayed, not edited: each plays through `ragen.rollout.run_episodes` from the transformed first state
with its responses transformed and re-tokenised, so its token sequence, masks and turn ends are built exactly as a
rollout's are, and a copy whose replay does not end as its original did (other rewards, success, actions, turns or
end; a response that re-tokenises longer can reach the context limit sooner) is dropped and counted.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Sequence

from ragen.config import SYMMETRY_MODES, RolloutConfig
from ragen.envs.base import TextEnv
from ragen.envs.sokoban import ACTIONS, MOVES
from ragen.policy.chat import ChatRenderer
from ragen.policy.sampling import Sample
from ragen.records import EpisodeSpec, Trajectory
from ragen.rollout import Responder, run_episodes
from ragen.shaping import Potential

# name -> (transpose, then reverse each row, then reverse the row order): the seven non-identity symmetries of a square
# (the dihedral group D4); the four without a transpose keep any rectangle's shape, and a transpose swaps its sides
TRANSFORMS: dict[str, tuple[bool, bool, bool]] = {
    "mirror": (False, True, False), "flip": (False, False, True), "half_turn": (False, True, True),
    "transpose": (True, False, False), "quarter_turn": (True, True, False),  # quarter_turn: clockwise
    "three_quarter_turn": (True, False, True), "anti_transpose": (True, True, True),
}
# algo.symmetry -> the transforms whose copies join each kept trajectory. rotate (the quarter turns, C4) and orbit (all
# of D4) move each direction to every other one, so what a copy set adds to the opening's logits is the same for the
# four directions; mirror and flip (and both with the half turn) never turn a vertical move into a horizontal one
SYMMETRIES: dict[str, tuple[str, ...]] = dict(zip(SYMMETRY_MODES, (
    (), ("mirror",), ("flip",), ("quarter_turn", "half_turn", "three_quarter_turn"), tuple(TRANSFORMS))))
_DIRECTION = re.compile(r"\b(" + "|".join(a.lower() for a in ACTIONS) + r")\b", re.IGNORECASE)


def transform_grid(state: str, name: str) -> str:
    """A rendered grid (rows joined by newlines) under transform `name`."""
    transpose, reverse_rows, reverse_order = TRANSFORMS[name]
    rows = state.split("\n")
    if transpose:
        rows = ["".join(column) for column in zip(*rows)]
    rows = [row[::-1] for row in rows] if reverse_rows else rows
    return "\n".join(rows[::-1] if reverse_order else rows)


def direction_map(name: str) -> dict[str, str]:
    """Each Sokoban action (lower case) -> the action it becomes: its move (d_row, d_col) under the grid's transform."""
    transpose, reverse_rows, reverse_order = TRANSFORMS[name]
    out = {}
    for action, (dr, dc) in zip(ACTIONS, MOVES):
        dr, dc = (dc, dr) if transpose else (dr, dc)
        dr, dc = (-dr if reverse_order else dr), (-dc if reverse_rows else dc)
        out[action.lower()] = ACTIONS[MOVES.index((dr, dc))].lower()
    return out


def transform_text(text: str, name: str) -> str:
    """`text` with the direction words exchanged as the transform maps them, whole words only ("Upper" stays), all at
    once, in the case they were written in (Left -> Right, left -> right, LEFT -> RIGHT)."""
    swaps = direction_map(name)

    def swap(match: re.Match) -> str:
        word = match.group(0)
        new = swaps[word.lower()]
        if word.isupper() and len(word) > 1:
            return new.upper()
        return new.capitalize() if word[0].isupper() else new

    return _DIRECTION.sub(swap, text)


def replay_responder(scripts: Sequence[Sequence[Sample]]) -> Responder:
    """Answers episode i's k-th turn with scripts[i][k]; the first call (every episode's first turn, in spec order)
    names the episodes by their env objects, which live as long as the pass."""
    rows: dict[int, int] = {}
    turns: dict[int, int] = {}

    def respond(prompts: list[list[int]], envs: list[TextEnv]) -> list[Sample]:
        if not rows:
            rows.update({id(env): i for i, env in enumerate(envs)})
        samples = []
        for env in envs:
            row, turn = rows[id(env)], turns.get(id(env), 0)
            turns[id(env)] = turn + 1
            samples.append(scripts[row][turn])
        return samples

    return respond


def _script(trajectory: Trajectory, name: str, renderer: ChatRenderer) -> list[Sample]:
    tokenizer, samples = renderer.tokenizer, []
    for turn in trajectory.turns:
        ids = tokenizer.encode(transform_text(turn.response, name), add_special_tokens=False)
        if turn.finish == "eos":
            ids.append(turn.response_ids[-1])  # the end-of-turn token the sampler stopped on
        samples.append(Sample(tuple(ids), (0.0,) * len(ids), turn.finish))
    return samples


def _same_outcome(a: Trajectory, b: Trajectory) -> bool:
    return (len(a.turns) == len(b.turns) and a.end_reason == b.end_reason and a.success == b.success
            and a.num_actions == b.num_actions and abs(a.traj_return - b.traj_return) < 1e-9
            and all(x.reward == y.reward and x.penalty == y.penalty for x, y in zip(a.turns, b.turns)))


def with_copies(trajectories: Sequence[Trajectory], symmetry: str, renderer: ChatRenderer, cfg: RolloutConfig, *,
                max_positions: int, potential: Potential | None = None) -> tuple[list[Trajectory], list[int], int]:
    """Each trajectory followed by its copies under `symmetry` (a key of SYMMETRIES) -> (trajectories, for each the
    index of its original in `trajectories`, copies dropped).

    A copy under the j-th transform joins group `group_id + (j + 1) * span` (span: one more than the largest group
    id), so group statistics (GRPO's mean and std) see the originals' groups and their copies' apart, each the same.
    Each original comes right before its copies, so a mini-batch holds both."""
    names = SYMMETRIES[symmetry]
    if not names or not trajectories:
        return list(trajectories), list(range(len(trajectories))), 0
    span = max(t.group_id for t in trajectories) + 1
    specs, scripts = [], []
    for trajectory in trajectories:
        for j, name in enumerate(names):
            layout = transform_grid(trajectory.turns[0].state, name)
            specs.append(EpisodeSpec(trajectory.tag, trajectory.seed, trajectory.group_id + (j + 1) * span, layout))
            scripts.append(_script(trajectory, name, renderer))
    replayed = run_episodes(specs, replay_responder(scripts), renderer, replace(cfg, max_episodes_per_pass=0),
                            max_positions=max_positions, potential=potential)
    out, origin, dropped = [], [], 0
    copies = iter(replayed)
    for i, trajectory in enumerate(trajectories):
        out.append(trajectory)
        origin.append(i)
        for _ in names:
            copy = next(copies)
            if _same_outcome(trajectory, copy):
                out.append(copy)
                origin.append(i)
            else:
                dropped += 1
    return out, origin, dropped
