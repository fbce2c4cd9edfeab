"""Copies of trajectories under the symmetries of a grid (`algo.symmetry`; not RAGEN's).

A Sokoban room mirrored left to right is another room, and the same play mirrored (every state mirrored, Left and
Right swapped in every response, thoughts included) is a play of it with the same rewards turn by turn; likewise
upside down (Up and Down swapped) and both at once (a half turn, which any rectangle allows). Each kept trajectory
of a step can so be trained on together with its copies, which share its score (its normalised return):

    copies(tau) = {g(tau) : g in G},   G = {mirror} | {flip} | {mirror, flip, half_turn} (orbit)

Why: a copy carries the same outcome as its original with the directions exchanged, so in the update the part of
the gradient that does not depend on the room (a drift of the opening towards one direction, the template collapse
of bench/RESULTS.md) cancels between them, while what depends on the room adds up. The copies are not samples of
the policy: the PPO ratio of a copy is taken against the policy's re-scored log-probs of the copy (its old
log-probs; the sampler never drew it), so `algo.old_logprobs` must be rescore.

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
from ragen.policy.chat import ChatRenderer
from ragen.policy.sampling import Sample
from ragen.records import EpisodeSpec, Trajectory
from ragen.rollout import Responder, run_episodes
from ragen.shaping import Potential

# name -> (reverse each row, reverse the row order, the action words exchanged)
TRANSFORMS: dict[str, tuple[bool, bool, dict[str, str]]] = {
    "mirror": (True, False, {"left": "right", "right": "left"}),
    "flip": (False, True, {"up": "down", "down": "up"}),
    "half_turn": (True, True, {"left": "right", "right": "left", "up": "down", "down": "up"}),
}
# algo.symmetry -> the transforms whose copies join each kept trajectory
SYMMETRIES: dict[str, tuple[str, ...]] = dict(zip(SYMMETRY_MODES, ((), ("mirror",), ("flip",),
                                                                    ("mirror", "flip", "half_turn"))))
_DIRECTION = re.compile(r"\b(up|down|left|right)\b", re.IGNORECASE)


def transform_grid(state: str, name: str) -> str:
    """A rendered grid (rows joined by newlines) under transform `name`."""
    reverse_rows, reverse_order, _ = TRANSFORMS[name]
    rows = state.split("\n")
    rows = [row[::-1] for row in rows] if reverse_rows else rows
    return "\n".join(rows[::-1] if reverse_order else rows)


def transform_text(text: str, name: str) -> str:
    """`text` with the direction words exchanged as the transform maps them, whole words only ("Upper" stays), in the
    case they were written in (Left -> Right, left -> right, LEFT -> RIGHT)."""
    swaps = TRANSFORMS[name][2]

    def swap(match: re.Match) -> str:
        word = match.group(0)
        new = swaps.get(word.lower())
        if new is None:
            return word
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
