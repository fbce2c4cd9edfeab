"""Advantages and returns for StarPO (RAGEN section 1.5): GAE with a critic, or group-normalised returns (GRPO).

Shapes: B trajectories, T token positions (left padded), all quantities aligned to tokens. The whole trajectory
return sits on its last token (or each turn's reward at the turn's end), so with gamma = lam = 1 GAE gives
A_t = R - V_t on every token. As in RAGEN/verl, the recursion runs over every position, masked ones included;
values outside the loss mask count as 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """sum(x * m) / sum(m): a token-level mean over the masked entries (0 when the mask is empty)."""
    mask = mask.to(x.dtype)
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


def whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps) over the masked entries, unbiased variance (verl's masked_whiten, shift_mean).

    Entries outside the mask are whitened with the same statistics (they are never used).
    """
    mean = masked_mean(x, mask)
    count = mask.sum().clamp(min=2.0)
    var = (((x - mean) * mask) ** 2).sum() / (count - 1)
    return (x - mean) * torch.rsqrt(var + eps)


def compute_gae(token_rewards: torch.Tensor, values: torch.Tensor, loss_mask: torch.Tensor, *, gamma: float,
                lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016, eq. 16) over token positions.

        delta_t = r_t + gamma * V_{t+1} - V_t,     A_t = delta_t + gamma * lam * A_{t+1},     returns_t = A_t + V_t
    with V_T = A_T = 0 past the end and V masked to 0 outside `loss_mask`. No whitening here (see `whiten`).

    Args:
        token_rewards: (B, T) reward on each token (the return on the last token by default).
        values: (B, T) critic values V(x_<t), the state in which token t is chosen (`token_values`).
        loss_mask: (B, T) bool, True where the token is trained on.
    Returns:
        advantages (B, T), returns (B, T).
    """
    values = values * loss_mask  # (B, T)
    advantages = torch.zeros_like(token_rewards)  # (B, T)
    next_value = torch.zeros_like(token_rewards[:, 0])  # (B,)
    next_advantage = torch.zeros_like(token_rewards[:, 0])  # (B,)
    for t in reversed(range(token_rewards.shape[1])):
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        next_advantage = delta + gamma * lam * next_advantage
        advantages[:, t] = next_advantage
        next_value = values[:, t]
    return advantages, advantages + values


def compute_bilevel_gae(token_rewards: torch.Tensor, values: torch.Tensor, loss_mask: torch.Tensor,
                        turn_end_mask: torch.Tensor, *, gamma: float, lam: float, turn_gamma: float,
                        turn_lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Turn-level (bi-level) GAE, RAGEN's `bi_level_gae` extension: GAE over turns, then over tokens in each turn.

    High level, over the K turn ends e_1 < ... < e_K of a trajectory (one MDP step per turn):
        R_k = sum of the rewards in (e_{k-1}, e_k] outside the turn's own tokens, plus r_{e_k}
              (rewards after e_K count for turn K)
        delta_k = R_k + turn_gamma * V(e_{k+1}) - V(e_k),   A_k = delta_k + turn_gamma * turn_lam * A_{k+1},
        G_k = A_k + V(e_k)                                  (V(e_{K+1}) = A_{K+1} = 0)
    Low level, over the loss-mask tokens t of turn k (env tokens between turns are skipped), G_k as the reward
    on the turn's last token and no bootstrap past it:
        delta_t = r_t + gamma * V(t') - V(t)   (t' the next masked token of the same turn; r_{e_k} := G_k, V(e_k') := 0)
        A_t = delta_t + gamma * lam * A_{t'}, returns_t = A_t + V(t)
    Rewards on masked tokens inside a turn (the KL-in-reward penalty) stay at token level. So the turn end gets
    A_{e_k} = A_k, and with gamma = lam = 1 every token of turn k gets G_k - V(t). RAGEN finds turn ends as the
    positions with non-zero reward, which misses turns that earned exactly 0; here they are given explicitly.
    No whitening here (see `whiten`).

    Args:
        token_rewards: (B, T). values: (B, T) critic values. loss_mask: (B, T) bool.
        turn_end_mask: (B, T) bool, True on the last sampled token of each turn (inside loss_mask).
    Returns:
        advantages (B, T) and returns (B, T), zero outside the loss mask.
    """
    advantages = torch.zeros_like(token_rewards)  # (B, T)
    returns = torch.zeros_like(token_rewards)  # (B, T)
    for b in range(token_rewards.shape[0]):
        rewards, v, masked = token_rewards[b].tolist(), values[b].tolist(), loss_mask[b].tolist()
        ends = turn_end_mask[b].nonzero().flatten().tolist()
        if not ends:
            continue
        # turn rewards R_k: the turn end, the env tokens since the previous end, and anything after the last end
        turn_rewards = []
        for k, end in enumerate(ends):
            lo, hi = (ends[k - 1] + 1 if k else 0), (len(rewards) - 1 if k == len(ends) - 1 else end)
            turn_rewards.append(rewards[end] + sum(rewards[t] for t in range(lo, hi + 1)
                                                   if t != end and (not masked[t] or t > end)))
        goals, next_value, next_adv = [0.0] * len(ends), 0.0, 0.0
        for k in reversed(range(len(ends))):  # high level: over turns
            delta = turn_rewards[k] + turn_gamma * next_value - v[ends[k]]
            next_adv = delta + turn_gamma * turn_lam * next_adv
            goals[k], next_value = next_adv + v[ends[k]], v[ends[k]]
        for k, end in enumerate(ends):  # low level: over the masked tokens of turn k, backwards from its end
            lo = ends[k - 1] + 1 if k else 0
            positions = [t for t in range(lo, end + 1) if masked[t]]
            next_value, next_adv = 0.0, 0.0
            for t in reversed(positions):
                reward = goals[k] if t == end else rewards[t]
                delta = reward + gamma * next_value - v[t]
                next_adv = delta + gamma * lam * next_adv
                advantages[b, t], returns[b, t] = next_adv, next_adv + v[t]
                next_value = v[t]
    return advantages, returns


def value_targets(token_rewards: torch.Tensor, loss_mask: torch.Tensor, turn_end_mask: torch.Tensor, *,
                  advantage: str, gamma: float, turn_gamma: float) -> torch.Tensor:
    """Monte Carlo value targets for warming a critic up: the returns of the advantage estimator with V = 0 and
    lambda = 1, i.e. what the critic of `compute_gae` or `compute_bilevel_gae` regresses onto before it has values.

        gae:          G_t = sum_{t' >= t} gamma^(t' - t) r_t'   (R on every token when gamma = 1 and R is on the last)
        bilevel_gae:  G_t = sum_{j >= k} turn_gamma^(j - k) R_j for every token t of turn k when gamma = 1
                      (R_j the turn rewards of `compute_bilevel_gae`; earlier turns' rewards are not in it)

    Args:
        token_rewards: (B, T). loss_mask: (B, T) bool. turn_end_mask: (B, T) bool (bilevel_gae only).
    Returns:
        (B, T) targets; only the loss-mask positions are meant to be read.
    """
    zeros = torch.zeros_like(token_rewards)  # (B, T): no critic yet
    if advantage == "gae":
        return compute_gae(token_rewards, zeros, loss_mask, gamma=gamma, lam=1.0)[1]
    if advantage == "bilevel_gae":
        return compute_bilevel_gae(token_rewards, zeros, loss_mask, turn_end_mask, gamma=gamma, lam=1.0,
                                   turn_gamma=turn_gamma, turn_lam=1.0)[1]
    raise ValueError(f"algo.advantage {advantage!r} has no critic to warm up; value targets exist for gae and "
                     "bilevel_gae")


def compute_grpo_advantages(traj_returns: torch.Tensor, group_ids: torch.Tensor, loss_mask: torch.Tensor,
                            eps: float = 1e-6, *, by_std: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Group-normalised returns broadcast to tokens (RAGEN paper eq. 5; DeepSeekMath GRPO outcome supervision).

        A_i = (R_i - mean_{j in g(i)} R_j) / (std_{j in g(i)} R_j + eps),   0 when the group's std <= eps
    with the unbiased std over the rollouts of the same initial state. No whitening.
    by_std False drops the division (Dr. GRPO; verl norm_adv_by_std_in_grpo=False): A_i = R_i - mean_g R_j, so a
    group whose returns differ only by step penalties gets advantages of that size, not of size 1.

    Args:
        traj_returns: (B,) trajectory returns. group_ids: (B,) group of each trajectory.
        loss_mask: (B, T) bool.
    Returns:
        advantages (B, T) (zero outside the mask), returns (B, T) = advantages (no critic).
    """
    method = "mean_std" if by_std else "mean"
    normalized = normalize_returns(traj_returns, group_ids, method=method, eps=eps)  # (B,)
    advantages = normalized[:, None] * loss_mask  # (B, T)
    return advantages, advantages


def group_mean_values(returns: torch.Tensor, group_ids: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """GRPO's baseline written as a value on every token: the mean over a trajectory's group of its members' returns
    from their first trained token, the yardstick a critic of grouped rollouts has to beat.

        b_i = mean_{j in g(i)} G_{j, t0(j)},   V^grp_{i,t} = b_i on masked tokens of i, 0 elsewhere
    where t0(j) is j's first masked token. With gamma = lam = 1 and the return on the last token G_{j,t} = R_j on
    every token, so 1 - Var[G - V^grp] / Var[G] is the share of the return variance that lies between groups.

    Args:
        returns: (B, T) value targets. group_ids: (B,) group of each trajectory. loss_mask: (B, T) bool.
    Returns:
        (B, T) the group-mean value, zero outside the mask.
    """
    first = loss_mask.float().argmax(dim=1, keepdim=True)  # (B, 1) the first masked token (0 if none)
    start = returns.gather(1, first).squeeze(1)  # (B,)
    m = group_moments(start, group_ids)
    baseline = m.means[m.index].to(returns.dtype)  # (B,)
    return baseline[:, None] * loss_mask  # (B, T)


def compute_rft_advantages(loss_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rejection-sampling fine-tuning as a policy gradient (RAFT, ReST-EM; not part of RAGEN): A_t = 1 on every
    trained token of every kept trajectory.

    With `filter.within: best_success` the kept trajectories are each group's best success, so at ratio 1 the PPO
    loss's gradient is the log-likelihood gradient of those episodes (supervised learning on the policy's own best
    rollouts) and the clip (1 + eps_high) bounds how far one step moves a token.

    Args:
        loss_mask: (B, T) bool.
    Returns:
        advantages (B, T) = loss_mask as floats, returns (B, T) = advantages (no critic).
    """
    advantages = loss_mask.float()  # (B, T)
    return advantages, advantages


def normalization_groups(group_ids: torch.Tensor, tags: Sequence[str], grouping: str) -> torch.Tensor:
    """The groups `normalize_returns` normalises within (RAGEN reward_normalization.grouping):

        state:     the rollouts of one initial state, i.e. the trajectory's group_id
        inductive: every rollout of the same env tag
        batch:     the whole batch, one group

    Args:
        group_ids: (B,) long. tags: B env tags.
    Returns:
        (B,) long group index of each trajectory.
    """
    if grouping == "state":
        return group_ids.clone()
    if grouping == "inductive":
        index = {tag: i for i, tag in enumerate(dict.fromkeys(tags))}  # in order of first appearance
        return torch.tensor([index[tag] for tag in tags], dtype=torch.long)
    if grouping == "batch":
        return torch.zeros_like(group_ids)
    raise ValueError(f"unknown reward normalisation grouping {grouping!r}; use state, inductive or batch")


@dataclass(frozen=True)
class GroupMoments:
    """Each group's size, mean and unbiased std of a (B,) tensor, in float64 (see `group_moments`)."""

    groups: torch.Tensor  # (G,) the distinct group ids, sorted
    index: torch.Tensor  # (B,) long: each member's position in `groups`
    counts: torch.Tensor  # (G,) float64
    means: torch.Tensor  # (G,) float64
    stds: torch.Tensor  # (G,) float64, 0 for a group of one


def group_moments(values: torch.Tensor, group_ids: torch.Tensor) -> GroupMoments:
    """The per-group statistics that GRPO, the score normalisation and the filter share:

        n_g = |g|,   mean_g = sum_{i in g} x_i / n_g,   std_g = sqrt(sum_{i in g} (x_i - mean_g)^2 / (n_g - 1))
    with std_g = 0 when n_g = 1. In float64: the sum of up to 2^29 float32 values is exact there, so a group of
    equal values has exactly their mean and std 0. In float32 the mean of eight returns of 10.9 (a one-move Sokoban
    solve) is one unit in the last place off and their std 1.02e-6, which scored every member of such a group
    -0.47 under GRPO's std division before 2026-12-04.

    Args:
        values: (B,) one value per trajectory. group_ids: (B,) long, the group of each.
    """
    groups, index = torch.unique(group_ids.to(values.device), return_inverse=True)  # (G,), (B,)
    x = values.to(torch.float64)  # (B,)
    zeros = torch.zeros(len(groups), dtype=torch.float64, device=x.device)  # (G,)
    counts = zeros.index_add(0, index, torch.ones_like(x))
    means = zeros.index_add(0, index, x) / counts
    squares = zeros.index_add(0, index, (x - means[index]) ** 2)
    stds = torch.where(counts > 1, squares / (counts - 1).clamp(min=1.0), zeros).sqrt()
    return GroupMoments(groups, index, counts, means, stds)


def normalize_returns(traj_returns: torch.Tensor, group_ids: torch.Tensor, *, method: str,
                      eps: float = 1e-6) -> torch.Tensor:
    """RAGEN's score normalisation within each group of `group_ids` (the trajectories' own groups, or those of
    `normalization_groups`): identity | mean | mean_std | asym_clip.

        mean:      R - mean_g
        mean_std:  (R - mean_g) / (std_g + eps), or 0 where std_g <= eps (unbiased std)
        asym_clip: mean_std clamped to [-1, 3]
    A group of one trajectory is left as it is. The group statistics are `group_moments`' (float64, so a group of
    equal returns scores exactly 0); the result is float32. A non-finite return makes its whole group non-finite, so
    that the update sees it and skips the step rather than train on a silently zeroed group.
    """
    if method == "identity":
        return traj_returns.clone()
    if method not in ("mean", "mean_std", "asym_clip"):
        raise ValueError(f"unknown reward normalisation {method!r}; use identity, mean, mean_std or asym_clip")
    m = group_moments(traj_returns, group_ids)
    r = traj_returns.to(torch.float64)  # (B,)
    scores = r - m.means[m.index]  # (B,)
    if method != "mean":
        std = m.stds[m.index]  # (B,)
        scores = torch.where(std <= eps, torch.zeros_like(scores), scores / (std + eps))  # a NaN std stays NaN
        if method == "asym_clip":
            scores = scores.clamp(-1.0, 3.0)
    return torch.where(m.counts[m.index] > 1, scores, r).float()  # a group of one keeps its return


def place_rewards(traj_returns: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """(B,) returns -> (B, T) token rewards with each return on its trajectory's last token (left padding: T-1)."""
    token_rewards = torch.zeros_like(attention_mask, dtype=torch.float32)  # (B, T)
    token_rewards[:, -1] = traj_returns
    return token_rewards
