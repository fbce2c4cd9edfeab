"""Multi-turn rollout: play many episodes at once, one sampling batch per turn, one token sequence per episode.

Per turn (RAGEN's es_manager semantics): render every active episode (its sequence so far is the prompt), sample
all responses in one batch, parse each, execute its valid actions in order until the action budget runs out or
the env ends, add the format penalty (rollout.format_penalty, -0.1) when the response does not parse or names an
invalid action, and drop finished episodes. Invalid actions are skipped, actions over the budget are dropped
without penalty, and the next user message starts with "Reward:\\n{turn reward}" (the penalty is not shown).
With rollout.max_episodes_per_pass the episodes play in passes of that many, each pass to its end, to bound memory.

`respond(prompts, envs)` produces the turn's responses: the policy's sampler for rollouts, or a script (random
valid actions, solver plans) for warm-start data, so demonstrations and rollouts share this one code path.
With a `potential` (ragen.shaping, training rollouts under algo.shaping solver) each turn also records its shaping,
Phi(after) - Phi(before), with Phi read from the env and the action and turn budget left; it is not shown either.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from ragen.config import RolloutConfig
from ragen.envs import make_env
from ragen.envs.base import TextEnv
from ragen.policy import Policy
from ragen.policy.chat import ChatRenderer
from ragen.policy.sampling import Sample, SamplingSession
from ragen.prompting import first_user_message, next_user_message, parse_response
from ragen.records import EpisodeSpec, Trajectory, Turn
from ragen.shaping import Potential

Responder = Callable[[list[list[int]], list[TextEnv]], list[Sample]]


@dataclass
class _Episode:
    spec: EpisodeSpec
    env: TextEnv
    messages: list
    ids: list[int]
    system_len: int
    actions_left: int
    sampled: list[bool] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    turn_ends: list[int] = field(default_factory=list)
    end_reason: str = ""

    def __post_init__(self) -> None:
        self.sampled = [False] * len(self.ids)
        self.logprobs = [0.0] * len(self.ids)

    def append(self, ids: Sequence[int], logprobs: Sequence[float] | None = None) -> None:
        self.ids.extend(ids)
        self.sampled.extend([logprobs is not None] * len(ids))
        self.logprobs.extend(logprobs if logprobs is not None else [0.0] * len(ids))


def policy_responder(policy: Policy, cfg: RolloutConfig, *, temperature: float | None = None,
                     generator: torch.Generator | None = None) -> Responder:
    """Sample from the policy with the rollout settings (temperature overridable, e.g. 0.5 for evaluation).

    The first call fixes the episodes (by env identity) of one KV-cache session; later turns of the same
    episodes only feed their new tokens, and episodes missing from a call have ended (`run_episodes` drops
    them), so their rows leave the cache. A call with other episodes starts a new session. The session's envs are
    kept alive with it: an id names one object only while it lives, and a later batch's env may take the address
    of an earlier batch's (one responder serves every pass of `evaluate_policy`).
    """
    state: dict = {"session": None, "rows": {}, "envs": []}

    def respond(prompts: list[list[int]], envs: list[TextEnv]) -> list[Sample]:
        if state["session"] is None or any(id(env) not in state["rows"] for env in envs):
            state["rows"], state["envs"] = {id(env): row for row, env in enumerate(envs)}, list(envs)
            state["session"] = SamplingSession(policy.model, policy.token_texts, len(envs))
        rows = [state["rows"][id(env)] for env in envs]
        state["session"].release(sorted(set(state["rows"].values()) - set(rows)))
        return state["session"].sample(rows, prompts, max_new_tokens=cfg.max_new_tokens,
                                       temperature=cfg.temperature if temperature is None else temperature,
                                       top_p=cfg.top_p, top_k=cfg.top_k, generator=generator)
    return respond


def run_episodes(specs: Sequence[EpisodeSpec], respond: Responder, renderer: ChatRenderer, cfg: RolloutConfig,
                 *, max_positions: int, potential: Potential | None = None) -> list[Trajectory]:
    """Play every spec to its end; returns one Trajectory per spec, in order (each turn shaped by `potential`).

    With `cfg.max_episodes_per_pass` k > 0 the specs play in passes of k consecutive ones, each pass to its end
    before the next starts, so no `respond` call sees more than k episodes (its KV cache holds k sequences); the
    passes draw from the responder's one random stream in turn."""
    k = cfg.max_episodes_per_pass or max(len(specs), 1)
    return [t for start in range(0, len(specs), k)
            for t in _run_pass(specs[start : start + k], respond, renderer, cfg, max_positions, potential)]


def _run_pass(specs: Sequence[EpisodeSpec], respond: Responder, renderer: ChatRenderer, cfg: RolloutConfig,
              max_positions: int, potential: Potential | None) -> list[Trajectory]:
    """Play `specs` together: one `respond` call a turn over the episodes still running."""
    episodes = []
    for spec in specs:
        env = make_env(spec.tag)
        obs, _ = env.reset(seed=spec.seed, options={"layout": spec.layout} if spec.layout else None)
        user = first_user_message(env, obs, env.max_actions_per_traj, cfg.enable_think)
        messages, ids, system_len = renderer.start(user)
        episodes.append(_Episode(spec, env, messages, ids, system_len, env.max_actions_per_traj))
    for turn in range(1, cfg.max_turns + 1):
        active = [e for e in episodes if not e.end_reason]
        if not active:
            break
        samples = respond([e.ids for e in active], [e.env for e in active])
        for episode, sample in zip(active, samples):
            _play_turn(episode, sample, turn, renderer, cfg, max_positions, potential)
    return [_to_trajectory(e) for e in episodes]


def _play_turn(ep: _Episode, sample: Sample, turn: int, renderer: ChatRenderer, cfg: RolloutConfig,
               max_positions: int, potential: Potential | None = None) -> None:
    env, tokenizer = ep.env, renderer.tokenizer
    turns_left = env.turn_limit(cfg.max_turns) - turn + 1  # this turn included
    before = potential(env, ep.actions_left, turns_left) if potential else 0.0
    ended_with_eos = sample.finish == "eos"
    text_ids = sample.token_ids[:-1] if ended_with_eos else sample.token_ids
    response = tokenizer.decode(text_ids, skip_special_tokens=True)
    stop_text = tokenizer.decode(sample.token_ids[-1:]) if ended_with_eos else ""
    parsed = parse_response(renderer.prefix + response, cfg.max_actions_per_turn, cfg.enable_think)
    actions_valid = parsed.format_ok and all(env.is_valid_action(a) for a in parsed.actions)
    state, reward, executed, effective, terminated, truncated = env.render(), 0.0, 0, 0, False, False
    for action in parsed.actions:
        if ep.actions_left == 0 or terminated or truncated:
            break  # over the budget: dropped without penalty
        obs, r, terminated, truncated, info = env.step(action)
        if info["action_is_valid"]:
            reward, executed, ep.actions_left = reward + r, executed + 1, ep.actions_left - 1
            effective += bool(info["action_is_effective"])
    after = potential(env, ep.actions_left, turns_left - 1) if potential else 0.0
    ep.append(sample.token_ids, sample.logprobs)
    ep.turn_ends.append(len(ep.ids) - 1)
    ep.turns.append(Turn(
        state=state, response=response, response_ids=tuple(sample.token_ids),
        response_logprobs=tuple(sample.logprobs), finish=sample.finish, think=parsed.think, actions=parsed.actions,
        executed=executed, reward=reward, penalty=0.0 if actions_valid else cfg.format_penalty,
        format_ok=parsed.format_ok, actions_valid=actions_valid, shaping=after - before, effective=effective,
    ))
    if terminated:
        ep.end_reason = "terminated"
    elif truncated:
        ep.end_reason = "truncated"
    elif ep.actions_left == 0:
        ep.end_reason = "budget"
    elif turn >= env.turn_limit(cfg.max_turns):
        ep.end_reason = "turns"
    user = None
    if not ep.end_reason:
        user = next_user_message(reward, turn + 1, env.render(), ep.actions_left, cfg.enable_think)
    tail = renderer.continue_ids(ep.messages, response, stop_text, user)
    if user is not None and len(ep.ids) + len(tail) + cfg.max_new_tokens > max_positions:
        ep.end_reason, user = "context", None  # the next turn would not fit: close the episode here
        tail = renderer.continue_ids(ep.messages, response, stop_text, None)
    ep.messages.append(renderer.assistant_message(response))
    if user is not None:
        ep.messages.append({"role": "user", "content": user})
    ep.append(tail)


def _to_trajectory(ep: _Episode) -> Trajectory:
    return Trajectory(
        tag=ep.spec.tag, seed=ep.spec.seed, group_id=ep.spec.group_id, turns=tuple(ep.turns),
        env_return=sum(t.reward for t in ep.turns), penalty=sum(t.penalty for t in ep.turns),
        shaping=sum(t.shaping for t in ep.turns),
        success=bool(ep.env.last_success), num_actions=sum(t.executed for t in ep.turns),
        end_reason=ep.end_reason or "turns", token_ids=tuple(ep.ids), sampled_mask=tuple(ep.sampled),
        sampled_logprobs=tuple(ep.logprobs), system_len=ep.system_len, turn_ends=tuple(ep.turn_ends),
    )


def summarize(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """Episode- and turn-level rates of a batch (RAGEN's rollout metrics, namespace-free).

    pass_at_n: the share of groups (the rollouts of one start: same tag and group_id) with at least one success,
    RAGEN's pass@N with N the group size; effective_action_rate: of the executed actions, the share that changed
    the env's state (RAGEN's action_is_effective; a push into a wall is valid and not effective), 0 with none.
    """
    turns = [t for traj in trajectories for t in traj.turns]
    n, m = max(len(trajectories), 1), max(len(turns), 1)
    groups: dict[tuple[str, int], bool] = {}
    for t in trajectories:
        groups[t.tag, t.group_id] = groups.get((t.tag, t.group_id), False) or t.success
    return {
        "success_rate": sum(t.success for t in trajectories) / n,
        "pass_at_n": sum(groups.values()) / max(len(groups), 1),
        "return_mean": sum(t.traj_return for t in trajectories) / n,
        "env_return_mean": sum(t.env_return for t in trajectories) / n,
        "turns_mean": len(turns) / n,
        "actions_mean": sum(t.num_actions for t in trajectories) / n,
        "effective_action_rate": sum(t.effective for t in turns) / max(sum(t.executed for t in turns), 1),
        "format_ok_rate": sum(t.format_ok for t in turns) / m,
        "format_valid_rate": sum(t.actions_valid for t in turns) / m,
        "response_tokens_mean": sum(len(t.response_ids) for t in turns) / m,
        "think_chars_mean": sum(len(t.think) for t in turns) / m,
        "sequence_tokens_mean": sum(len(t.token_ids) for t in trajectories) / n,
    }
