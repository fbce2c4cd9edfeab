"""StarPO-S uncertainty filtering (RAGEN paper eq. 7 and section 1.4): keep whole groups by in-group reward spread.

U(s0) = Std_{tau ~ pi(.|s0)}[R(tau)], estimated by the unbiased std of the returns of the K rollouts of a group.
Shapes: B = G*K trajectories; group_ids (B,); the result is a keep mask (B,) that keeps or drops whole groups.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ragen.advantages import group_moments
from ragen.config import FILTER_MODES


@dataclass(frozen=True)
class FilterStats:
    kept_frac: float  # kept trajectories / all trajectories
    kept_groups: int
    groups: int
    std_mass_kept: float  # sum of the kept groups' std / sum over all groups (1 when every std is 0)
    group_std_mean: float  # mean in-group std over all groups (RAGEN rollout/in_group_std)
    group_std_max: float
    kept_std_mean: float  # mean in-group std over kept groups (rollout/chosen_in_group_std)
    frac_zero_std: float  # groups whose returns are all equal

    def as_metrics(self) -> dict[str, float]:
        return {k: float(v) for k, v in self.__dict__.items()}


def group_stds(traj_returns: torch.Tensor, group_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (groups (G,), unbiased std of each group's returns (G,)); a group of one has std 0. The statistics are
    `ragen.advantages.group_moments`' (float64: a group of equal returns has std exactly 0)."""
    m = group_moments(traj_returns, group_ids)
    return m.groups, m.stds.float()


TOP_P_EPS = 0.01  # RAGEN's selection_eps: the mass threshold sits this far (in the ranked scores' units) below p * S


def top_p_count(sorted_stds: torch.Tensor, p: float, eps: float = TOP_P_EPS) -> int:
    """How many groups the linear top-p rule keeps, given their stds sorted in descending order (G,):

        k = min { k : sum_{i <= k} s_(i) >= p * S - eps },   S = sum_i s_i,   only groups with s_(i) > 0
    (RAGEN-2's SNR-aware filter; eps keeps p = 1 reachable under float rounding). 0 when no group has a spread."""
    positive = sorted_stds[sorted_stds > 0].double()  # (G+,): already descending
    if len(positive) == 0:
        return 0
    reached = torch.cumsum(positive, 0) >= p * float(sorted_stds.double().sum()) - eps  # (G+,)
    return int(reached.nonzero()[0]) + 1 if bool(reached.any()) else len(positive)


def filter_groups_by_reward_std(traj_returns: torch.Tensor, group_ids: torch.Tensor, keep_ratio: float,
                                mode: str = "std") -> tuple[torch.Tensor, FilterStats]:
    """Keep the groups that teach the most.

    mode "std": the top int(keep_ratio * G) groups by in-group std (RAGEN's default, StarPO-S keep_ratio 0.25);
    "std_rev": the lowest; "nonzero": every group whose std > 0 (DAPO's dynamic sampling; keep_ratio unused);
    "top_p": the fewest groups, largest std first, whose stds add up to keep_ratio of the batch's std mass, none of
    them without a spread (RAGEN-2's SNR-aware filter, "top-p linear", which it runs at 0.9; `top_p_count`), so the
    number kept follows how the spread is spread: a batch where a few groups hold it keeps few.
    Ties are broken towards the lower group id (stable sort), so the result is deterministic. keep_ratio 1 with
    "std" keeps everything (vanilla StarPO).
    """
    groups, stds = group_stds(traj_returns, group_ids)
    if mode not in FILTER_MODES:
        raise ValueError(f"unknown filter mode {mode!r}; use one of {', '.join(FILTER_MODES)}")
    if mode == "nonzero":
        kept = groups[stds > 0]
    else:
        order = torch.sort(stds, descending=(mode != "std_rev"), stable=True).indices
        if mode == "top_p":
            count = top_p_count(stds[order], keep_ratio)
        else:
            count = max(1, int(keep_ratio * len(groups))) if keep_ratio > 0 else 0
        kept = groups[order[:count]]
    keep = torch.isin(group_ids, kept)  # (B,)
    kept_stds = stds[torch.isin(groups, kept)]
    total = float(stds.sum())
    stats = FilterStats(
        kept_frac=float(keep.float().mean()), kept_groups=len(kept), groups=len(groups),
        std_mass_kept=float(kept_stds.sum()) / total if total > 0 else 1.0,
        group_std_mean=float(stds.mean()), group_std_max=float(stds.max()),
        kept_std_mean=float(kept_stds.mean()) if len(kept_stds) else 0.0,
        frac_zero_std=float((stds == 0).float().mean()),
    )
    return keep, stats


def best_success_per_group(traj_returns: torch.Tensor, group_ids: torch.Tensor, success: torch.Tensor,
                           num_actions: torch.Tensor) -> torch.Tensor:
    """Keep, in each group, only its best successful trajectory: the filter of rejection-sampling fine-tuning
    (RAFT, ReST-EM, expert iteration), not part of RAGEN.

        keep_i = success_i and i = argmax_{j in g(i), success_j} (R_j, -actions_j, -j)
    i.e. the highest return, then the fewest actions, then the first; a group without a success keeps nothing.
    Under an outcome reward every success of a group earns about the same advantage; the best one alone carries
    which action fits the instance (bench/bench_self_imitation.py).

    Args:
        traj_returns: (B,) returns. group_ids: (B,). success: (B,) bool. num_actions: (B,) actions executed.
    Returns:
        keep (B,) bool, at most one True per group.
    """
    keep = torch.zeros(success.shape, dtype=torch.bool)  # (B,)
    rank = list(zip(traj_returns.tolist(), (-num_actions).tolist()))  # larger is better; ties: the first wins
    best: dict[int, int] = {}
    for i in torch.nonzero(success).flatten().tolist():
        group = int(group_ids[i])
        if group not in best or rank[i] > rank[best[group]]:
            best[group] = i
    keep[list(best.values())] = True
    return keep
