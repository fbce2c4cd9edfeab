"""Records passed between modules (frozen dataclasses).

Shape legend used across ragen: G groups (env instances), K rollouts per group, B = G*K trajectories,
T token positions, V vocabulary, L turns. Prefixes give the granularity: token_* (B, T), traj_* (B,), group_* (G,).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EpisodeSpec:
    """One episode to play: which env, which seed (shared by a group), which group, optionally a fixed layout."""

    tag: str
    seed: int
    group_id: int = 0
    layout: str | None = None


@dataclass(frozen=True)
class Turn:
    state: str  # the observation shown this turn
    response: str  # decoded sampled text, without the forced prefix
    response_ids: tuple[int, ...]  # the sampled token ids (token in, token out)
    response_logprobs: tuple[float, ...]  # their log-probs under the sampling policy (temperature 1)
    finish: str  # "stop" | "eos" | "length"
    think: str  # the parsed reasoning ("" if it did not parse)
    actions: tuple[str, ...]  # parsed actions, at most max_actions_per_turn
    executed: int  # actions the env executed this turn
    reward: float  # env reward of the turn (sum over executed actions)
    penalty: float  # format penalty of the turn (0 or rollout.format_penalty)
    format_ok: bool  # the response parsed
    actions_valid: bool  # it parsed and every action is valid for the env
    shaping: float = 0.0  # c * (Phi(after) - Phi(before)) under algo.shaping solver (ragen.shaping), else 0
    effective: int = 0  # of the executed actions, those that changed the env's state (info action_is_effective)


@dataclass(frozen=True)
class Trajectory:
    """A whole episode: its turns and its single token sequence (system + all turns)."""

    tag: str
    seed: int
    group_id: int
    turns: tuple[Turn, ...]
    env_return: float  # sum of env rewards
    penalty: float  # sum of format penalties (<= 0)
    success: bool
    num_actions: int  # actions executed
    end_reason: str  # terminated | truncated | budget | turns | context
    token_ids: tuple[int, ...]  # (T,) the episode as one sequence
    sampled_mask: tuple[bool, ...]  # (T,) True at sampled (assistant) tokens
    sampled_logprobs: tuple[float, ...]  # (T,) sampling log-prob at sampled tokens, 0 elsewhere
    system_len: int  # tokens of the system message (the paper's runs train on everything after it)
    turn_ends: tuple[int, ...]  # (L,) index of each turn's last sampled token
    shaping: float = 0.0  # sum of the turns' shaping (0 without algo.shaping)

    @property
    def traj_return(self) -> float:
        """RAGEN's trajectory score: env rewards plus format penalties (plus the shaping, when there is any)."""
        return self.env_return + self.penalty + self.shaping
