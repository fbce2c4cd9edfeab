"""Trajectories -> padded training tensors: one row per trajectory, left padded, aligned to tokens.

Loss mask (RAGEN section 1.2): "assistant" trains on the sampled tokens only (the default; RAGEN main trains on
assistant turns); "all" trains on every token after the system message, environment text included, as the
paper's runs did (V0423's enable_response_mask=False). Reward placement: "last" puts the trajectory return
(env rewards + format penalties + any shaping) on the last token; "turn" puts each turn's reward + penalty +
shaping on its last sampled token (RAGEN's use_turn_scores; shaping is `ragen.shaping`'s, 0 without it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from ragen.records import Trajectory


@dataclass(frozen=True)
class RolloutBatch:
    input_ids: torch.Tensor  # (B, T) long
    attention_mask: torch.Tensor  # (B, T) long, 1 on real tokens
    loss_mask: torch.Tensor  # (B, T) bool
    sampled_logprobs: torch.Tensor  # (B, T) the sampler's log-probs at sampled tokens, 0 elsewhere
    token_rewards: torch.Tensor  # (B, T) float
    traj_returns: torch.Tensor  # (B,) env rewards + penalties (+ shaping)
    group_ids: torch.Tensor  # (B,) long
    turn_end_mask: torch.Tensor  # (B, T) bool, True on the last sampled token of each turn


def build_batch(trajectories: Sequence[Trajectory], *, pad_id: int, device: torch.device,
                loss_mask: str = "assistant", reward_placement: str = "last") -> RolloutBatch:
    width = max(len(t.token_ids) for t in trajectories)
    shape = (len(trajectories), width)
    ids = torch.full(shape, pad_id, dtype=torch.long)
    attention = torch.zeros(shape, dtype=torch.long)
    mask = torch.zeros(shape, dtype=torch.bool)
    logprobs = torch.zeros(shape)
    rewards = torch.zeros(shape)
    turn_ends = torch.zeros(shape, dtype=torch.bool)
    for row, traj in enumerate(trajectories):
        offset = width - len(traj.token_ids)  # left padding
        ids[row, offset:] = torch.tensor(traj.token_ids)
        attention[row, offset:] = 1
        logprobs[row, offset:] = torch.tensor(traj.sampled_logprobs)
        if loss_mask == "assistant":
            mask[row, offset:] = torch.tensor(traj.sampled_mask)
        elif loss_mask == "all":
            mask[row, offset + traj.system_len :] = True
        else:
            raise ValueError(f"unknown loss_mask {loss_mask!r}; use assistant or all")
        turn_ends[row, [offset + end for end in traj.turn_ends]] = True
        if reward_placement == "last":
            rewards[row, -1] = traj.traj_return
        elif reward_placement == "turn":
            for turn, end in zip(traj.turns, traj.turn_ends):
                rewards[row, offset + end] += turn.reward + turn.penalty + turn.shaping
        else:
            raise ValueError(f"unknown reward_placement {reward_placement!r}; use last or turn")
    returns = torch.tensor([t.traj_return for t in trajectories], dtype=torch.float32)
    groups = torch.tensor([t.group_id for t in trajectories], dtype=torch.long)
    return RolloutBatch(ids.to(device), attention.to(device), mask.to(device), logprobs.to(device),
                        rewards.to(device), returns.to(device), groups.to(device), turn_ends.to(device))
