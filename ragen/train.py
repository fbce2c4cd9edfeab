"""The online StarPO / StarPO-S loop, one step at a time (RAGEN section 1.1).

Each step:
  1. roll out P groups x N rollouts of the train env; group g of step k starts from train-pool seed
     pool[(k * P + g) % len(pool)], shared by its N rollouts (common random numbers);
  2. returns = env rewards + format penalties (or 1 for each group's best success, 0 else: algo.outcome), plus
     algo.first_action_bonus when set, normalised (algo.reward_norm) within the groups of
     algo.reward_norm_grouping (initial state, env or batch);
  3. keep whole groups by in-group return std (filter.keep_ratio; 1 keeps all: vanilla StarPO), or of each
     only its best success (filter.within best_success);
  3b. with algo.symmetry, add each kept trajectory's copies under the grid's symmetries (ragen.symmetry);
  4. score: batch the kept trajectories, re-score their old log-probs and values, fold the KL into the reward if
     algo.kl = reward_k1 and compute the advantages (ragen.update.score_batch);
  5. critic and actor updates (ragen.update).
Timing splits each step into these phases: rollout (1), scoring (4) and update (5), each with its tokens per second.
Sampling at step k uses a generator seeded by (train.seed, k), so a run resumed from a checkpoint at step k
replays exactly what an uninterrupted run would have done.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Sequence

import torch
from transformers import PreTrainedModel

from ragen.advantages import normalization_groups, normalize_returns, value_targets
from ragen.batching import RolloutBatch, build_batch
from ragen.config import Config
from ragen.diagnostics import action_dependence, first_action_bonus
from ragen.diversity import response_diversity
from ragen.filters import best_success_per_group, filter_groups_by_reward_std, group_stds
from ragen.policy import Policy
from ragen.policy.scoring import score_sequences, shareable_prefix
from ragen.records import EpisodeSpec, Trajectory
from ragen.rollout import policy_responder, run_episodes, summarize
from ragen.shaping import Potential, make_potential
from ragen.symmetry import with_copies
from ragen.update import UpdateSettings, batch_passes, fit_values, score_batch, update


@dataclass
class Learner:
    """Everything a step changes or reads: the policy, the critic (gae and bilevel_gae only), the frozen reference,
    optimizers."""

    policy: Policy
    critic: PreTrainedModel | None
    ref: PreTrainedModel | None
    actor_opt: torch.optim.Optimizer
    critic_opt: torch.optim.Optimizer | None


def update_settings(cfg: Config) -> UpdateSettings:
    a = cfg.algo
    return UpdateSettings(
        advantage=a.advantage, gamma=a.gamma, lam=a.lam, turn_gamma=a.turn_gamma, eps_low=a.clip_eps_low,
        eps_high=a.clip_eps_high, dual_clip=a.dual_clip or None, entropy_coef=a.entropy_coef,
        kl_loss={"loss_k1": "k1", "loss_k3": "k3"}.get(a.kl), kl_coef=a.kl_coef,
        kl_reward_coef=a.kl_coef if a.kl == "reward_k1" else 0.0, value_clip=cfg.critic.value_clip,
        aggregation=a.aggregation, mini_batch_size=cfg.train.mini_batch_size, epochs=cfg.train.ppo_epochs,
        critic_epochs=cfg.critic.ppo_epochs, grad_clip=cfg.train.grad_clip, old_logprobs=a.old_logprobs,
        grpo_by_std=a.grpo_by_std, micro_batch_size=cfg.train.micro_batch_size,
        micro_batch_tokens=cfg.train.micro_batch_tokens)


def step_specs(cfg: Config, pool: Sequence[int], step: int) -> list[EpisodeSpec]:
    P, N = cfg.train.groups, cfg.train.group_size
    return [EpisodeSpec(cfg.train.env, pool[(step * P + g) % len(pool)], g) for g in range(P) for _ in range(N)]


def collect(cfg: Config, policy: Policy, pool: Sequence[int], step: int) -> list[Trajectory]:
    generator = torch.Generator(policy.model.device).manual_seed(cfg.train.seed * 1_000_003 + step)
    return run_episodes(step_specs(cfg, pool, step), policy_responder(policy, cfg.rollout, generator=generator),
                        policy.renderer(cfg.rollout.enable_think), cfg.rollout,
                        max_positions=policy.max_positions, potential=rollout_potential(cfg))


def rollout_potential(cfg: Config) -> Potential | None:
    """The shaping potential training rollouts play under (algo.shaping), None unshaped."""
    return make_potential(cfg.algo.shaping, cfg.algo.shaping_coef, cfg.rollout.max_actions_per_turn)


def add_copies(cfg: Config, policy: Policy, kept: Sequence[Trajectory], scores: torch.Tensor
               ) -> tuple[list[Trajectory], torch.Tensor, dict[str, float]]:
    """The kept trajectories with their copies under algo.symmetry (ragen.symmetry), each copy scored as its
    original, and the symmetry/ metrics: copies added, copies dropped (a replay that ended otherwise), seconds."""
    start = time.perf_counter()
    out, origin, dropped = with_copies(kept, cfg.algo.symmetry, policy.renderer(cfg.rollout.enable_think),
                                       cfg.rollout, max_positions=policy.max_positions,
                                       potential=rollout_potential(cfg))
    metrics = {"symmetry/copies": float(len(out) - len(kept)), "symmetry/dropped": float(dropped),
               "timing/symmetry_s": time.perf_counter() - start}
    return out, scores[torch.tensor(origin, dtype=torch.long)], metrics  # scores: (B',)


def rollout_metrics(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """The rollout/ family of one batch: `summarize`'s rates, the first action's dependence on the instance
    (ragen.diagnostics), how alike the responses are (ragen.diversity) and the in-group std of the raw returns, the
    Echo Trap signal (the filter sees normalised scores, as RAGEN's does: under mean_std every non-degenerate group
    has std 1)."""
    _, raw_stds = group_stds(torch.tensor([t.traj_return for t in trajectories]),
                             torch.tensor([t.group_id for t in trajectories]))
    metrics = summarize(trajectories) | action_dependence(trajectories) | response_diversity(trajectories)
    metrics["shaping_mean"] = sum(t.shaping for t in trajectories) / max(len(trajectories), 1)  # 0 unshaped
    metrics |= {"in_group_std_mean": float(raw_stds.mean()), "in_group_std_max": float(raw_stds.max())}
    return {f"rollout/{k}": v for k, v in metrics.items()}


def select(cfg: Config, trajectories: Sequence[Trajectory], *, already_filtered: bool = False,
           scores: Sequence[float] | None = None) -> tuple[list[Trajectory], torch.Tensor, dict[str, float]]:
    """Normalise returns and filter groups -> kept trajectories, their (normalised) returns, filter metrics.

    `already_filtered` (the stage-filter batch of step 1) keeps every group: filtering twice would drop more.
    `scores` are the normalised returns stage filter computed before it filtered (its output's score column); the
    filtered batch needs them unless algo.reward_norm_grouping is state: over a whole batch or env the filter has
    dropped members of the normalisation group, so normalising again would give other scores.
    """
    returns = torch.tensor([t.traj_return for t in trajectories])  # (B,)
    group_ids = torch.tensor([t.group_id for t in trajectories])  # (B,)
    best = None  # (B,) bool: each group's best success, when an option asks for it
    metrics: dict[str, float] = {}
    if "best_success" in (cfg.algo.outcome, cfg.filter.within):
        best = best_success_per_group(returns, group_ids, torch.tensor([t.success for t in trajectories]),
                                      torch.tensor([t.num_actions for t in trajectories]))
    if scores is not None:
        if len(scores) != len(trajectories):
            raise ValueError(f"{len(scores)} stored scores for {len(trajectories)} trajectories; rerun stage filter")
        scores = torch.tensor(list(scores), dtype=torch.float32)  # (B,)
    elif already_filtered and cfg.algo.reward_norm != "identity" and cfg.algo.reward_norm_grouping != "state":
        raise ValueError(f"algo.reward_norm_grouping {cfg.algo.reward_norm_grouping}: the filtered batch has no "
                         "scores normalised before filtering; rerun stage filter (dvc repro filter), which stores them")
    else:
        outcome = best.float() if cfg.algo.outcome == "best_success" else returns  # (B,)
        if cfg.algo.first_action_bonus != "none":
            bonus = torch.tensor(first_action_bonus(trajectories, cfg.algo.first_action_bonus))  # (B,)
            outcome = outcome + cfg.algo.first_action_coef * bonus
            metrics["rollout/first_action_bonus"] = float(bonus.mean())  # nats; 0 for unparsed openings
        norm_groups = normalization_groups(group_ids, [t.tag for t in trajectories], cfg.algo.reward_norm_grouping)
        scores = normalize_returns(outcome, norm_groups, method=cfg.algo.reward_norm)  # (B,)
    keep_ratio = 1.0 if already_filtered else cfg.filter.keep_ratio
    mode = "std" if already_filtered else cfg.filter.mode
    keep, stats = filter_groups_by_reward_std(scores, group_ids, keep_ratio, mode)
    metrics |= {f"filter/{k}": v for k, v in stats.as_metrics().items()}
    if cfg.filter.within == "best_success":  # of each kept group only its best success (idempotent on step 1)
        keep &= best
        metrics["filter/kept_frac"] = float(keep.float().mean())
    kept = [t for t, k in zip(trajectories, keep.tolist()) if k]
    return kept, scores[keep], metrics


def return_batch(cfg: Config, policy: Policy, kept: Sequence[Trajectory], scores: torch.Tensor) -> RolloutBatch:
    """Padded tensors with the rewards where algo.reward_placement puts them: the (normalised) return `scores` on
    the last token (last), or each turn's raw reward and penalty at its end (turn)."""
    batch = build_batch(kept, pad_id=policy.tokenizer.pad_token_id, device=policy.model.device,
                        loss_mask=cfg.algo.loss_mask, reward_placement=cfg.algo.reward_placement)
    if cfg.algo.reward_placement == "last":
        rewards = batch.token_rewards.clone()
        rewards[:, -1] = scores.to(rewards.device)
        batch = replace(batch, token_rewards=rewards, traj_returns=scores.to(rewards.device))
    return batch


def critic_batch(cfg: Config, policy: Policy, kept: Sequence[Trajectory], scores: torch.Tensor
                 ) -> tuple[RolloutBatch, torch.Tensor]:
    """`return_batch` and the critic's targets on it, (B, T): the advantage estimator's returns with no values
    (`ragen.advantages.value_targets`; with gae, gamma 1 and the return on the last token every token's is R)."""
    batch = return_batch(cfg, policy, kept, scores)
    targets = value_targets(batch.token_rewards, batch.loss_mask, batch.turn_end_mask, advantage=cfg.algo.advantage,
                            gamma=cfg.algo.gamma, turn_gamma=cfg.algo.turn_gamma)  # (B, T)
    return batch, targets


def warm_critic(cfg: Config, critic: PreTrainedModel, batch: RolloutBatch, targets: torch.Tensor) -> list[float]:
    """Stage critic_fit's warm-up: `critic.warmup_epochs` passes of `ragen.update.fit_values` over `batch` towards
    `targets` (from `critic_batch`), with an AdamW of its own (critic.lr, train.weight_decay) that the online loop
    does not inherit. Returns each pass's mean mini-batch value loss."""
    optimizer = torch.optim.AdamW(critic.parameters(), lr=cfg.critic.lr, weight_decay=cfg.train.weight_decay)
    return fit_values(critic, optimizer, batch, targets, epochs=cfg.critic.warmup_epochs,
                      mini_batch_size=cfg.train.mini_batch_size, grad_clip=cfg.train.grad_clip,
                      micro_batch_size=cfg.train.micro_batch_size, micro_batch_tokens=cfg.train.micro_batch_tokens)


def make_batch(cfg: Config, learner: Learner, kept: Sequence[Trajectory], scores: torch.Tensor
               ) -> tuple[RolloutBatch, torch.Tensor | None]:
    """`return_batch` and, with a KL (in the reward or as a loss), the reference's log-probs of its tokens."""
    batch = return_batch(cfg, learner.policy, kept, scores)
    ref_logprobs = None
    if cfg.algo.kl != "none" and learner.ref is not None:
        prefix_len = shareable_prefix(batch.input_ids, batch.attention_mask, batch.loss_mask)  # as score_batch
        ref_logprobs, _ = score_sequences(learner.ref, batch.input_ids, batch.attention_mask, with_entropy=False,
                                          prefix_len=prefix_len,
                                          passes=batch_passes(batch, max_rows=cfg.train.micro_batch_size,
                                                              max_tokens=cfg.train.micro_batch_tokens))
    return batch, ref_logprobs


def train_step(cfg: Config, learner: Learner, pool: Sequence[int], step: int,
               first_batch: Sequence[Trajectory] | None = None,
               first_scores: Sequence[float] | None = None,
               first_rollout: Sequence[Trajectory] | None = None) -> dict[str, float]:
    """One full step; `first_batch` replaces the rollout (stage update's step 1 uses the filtered base rollouts,
    with `first_scores`, their normalised returns from stage filter; see `select`). `first_rollout`, the whole
    batch stage rollout played before the filter, gives that step its rollout/ metrics, as a rollout in process
    gives every later step (the kept groups alone read a higher reward std and return), and its filter/ metrics,
    those of stage filter's own pass over that batch (the filtered batch, kept whole here, would read kept_frac 1).
    Such a step rolls nothing out, so it logs no rollout timing (its tokens per second would read ~1e8)."""
    start = time.perf_counter()
    trajectories = list(first_batch) if first_batch is not None else collect(cfg, learner.policy, pool, step)
    rollout_s = time.perf_counter() - start
    filtered = first_batch is not None
    kept, scores, metrics = select(cfg, trajectories, already_filtered=filtered,
                                   scores=first_scores if filtered else None)
    if kept and cfg.algo.symmetry != "none":
        kept, scores, copy_metrics = add_copies(cfg, learner.policy, kept, scores)
        metrics |= copy_metrics
    score_s = update_s = 0.0
    stats, trained_tokens = {"actor/skipped_steps": 1.0}, 0  # nothing kept (best_success, no success): no update
    if kept:
        start = time.perf_counter()
        settings = update_settings(cfg)
        batch, ref_logprobs = make_batch(cfg, learner, kept, scores)
        scored = score_batch(learner.policy.model, learner.critic, batch, settings, ref_logprobs=ref_logprobs)
        score_s = time.perf_counter() - start
        start = time.perf_counter()
        stats = update(learner.policy.model, learner.critic, learner.actor_opt, learner.critic_opt, batch, settings,
                       ref_logprobs=ref_logprobs, scored=scored)
        update_s = time.perf_counter() - start
        trained_tokens = int(batch.attention_mask.sum())
    if first_rollout is not None:  # stage filter's figures: the same `select` over the batch it filtered
        metrics |= select(cfg, first_rollout)[2]
    metrics |= rollout_metrics(first_rollout if first_rollout is not None else trajectories)
    metrics |= stats | {"timing/score_s": score_s, "timing/update_s": update_s,
                        "perf/score_tokens_per_s": trained_tokens / max(score_s, 1e-9),
                        "perf/update_tokens_per_s": trained_tokens / max(update_s, 1e-9)}
    if not filtered:
        sampled_tokens = sum(len(turn.response_ids) for t in trajectories for turn in t.turns)
        metrics |= {"timing/rollout_s": rollout_s, "perf/rollout_tokens_per_s": sampled_tokens / max(rollout_s, 1e-9)}
    return metrics
