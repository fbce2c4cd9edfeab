"""One StarPO optimisation step over a batch of (filtered) trajectories: critic, then actor (RAGEN section 1.7).

    advantages: GAE with the critic (PPO; whitened over masked tokens), group-normalised returns (GRPO), or 1 on
                every kept token (rft, with each group's best success kept: rejection-sampling fine-tuning)
    actor loss: ppo_clip_loss(decoupled eps_low / eps_high) - entropy_coef * H  [+ kl_coef * KL(pi || pi_ref)]
    critic loss: value_loss with value clip
Mini-batches of `mini_batch_size` trajectories, one optimizer step each, `epochs` passes over the batch in the same
order (RAGEN: 32 trajectories, ppo_epochs 1, no shuffle); the critic takes `critic_epochs` passes (verl's
critic.ppo_epochs; 0: as many as the actor), in the same mini-batch loop, so its passes beyond the actor's run after
them; each mini-batch runs in passes of at most `micro_batch_size` trajectories and `micro_batch_tokens` padded
tokens (`micro_batches`; 0 and 0: one pass) whose losses, weighted by their share of what the mini-batch's loss
averages over (`ragen.losses.aggregation_share`), accumulate into the gradient of one pass over the mini-batch
(RAGEN's micro_batch_size_per_gpu, without verl's dependence of the loss on it); gradients clipped to `grad_clip`; a
non-finite gradient norm skips the optimizer step and is counted.
Old log-probs (and values) are re-scored before the first step (`score_batch`), as in RAGEN, but on the very token
ids that were sampled (RAGEN re-tokenises text); `actor/sampler_logprob_gap` reports the largest difference from the
sampler's own log-probs on sampled tokens, which stays at float error when rollout and training agree on tokens.
`old_logprobs="sampler"` takes those sampler log-probs as log pi_old instead and skips the re-scoring pass (the same
policy at temperature 1 on the same ids, so the same values up to float error; only the sampled tokens have one, so
it needs the assistant loss mask). RAGEN re-scores because its sampler (vLLM) is another engine than its trainer.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import torch
from transformers import PreTrainedModel

from ragen.advantages import (compute_bilevel_gae, compute_gae, compute_grpo_advantages, compute_rft_advantages,
                              group_mean_values, masked_mean, whiten)
from ragen.batching import RolloutBatch
from ragen.losses import (aggregation_share, explained_variance, kl_penalty, ppo_clip_loss, token_share,
                          value_loss)
from ragen.policy.scoring import score_sequences, score_values, shareable_prefix, token_logprobs, token_values


@dataclass(frozen=True)
class UpdateSettings:
    advantage: str  # gae | bilevel_gae | grpo | rft
    gamma: float
    lam: float
    turn_gamma: float  # bilevel_gae: discount between turns
    eps_low: float
    eps_high: float
    dual_clip: float | None
    entropy_coef: float
    kl_loss: str | None  # None | k1 | k3 (KL as a loss term)
    kl_coef: float
    value_clip: float
    aggregation: str
    mini_batch_size: int
    grad_clip: float
    epochs: int = 1  # passes over the batch (RAGEN / verl ppo_epochs)
    critic_epochs: int = 0  # the critic's passes over the batch; 0: `epochs`
    kl_reward_coef: float = 0.0  # beta of a k1 KL folded into the token rewards before the advantages (reward_k1)
    share_prefix: bool = True  # run the rows' common prompt prefix once (same values); False: every row whole
    old_logprobs: str = "rescore"  # rescore (a no-grad pass before the first step, RAGEN) | sampler (the rollout's own)
    grpo_by_std: bool = True  # grpo: divide by the group's return std (False: Dr. GRPO, centred returns only)
    micro_batch_size: int = 0  # rows per forward and backward pass, gradients accumulated (0: the whole mini-batch)
    micro_batch_tokens: int = 0  # padded tokens per pass at most (0: no limit); either limit sorts rows by length


def _gae(batch: RolloutBatch, values: torch.Tensor | None, s: UpdateSettings) -> tuple[torch.Tensor, torch.Tensor]:
    advantages, returns = compute_gae(batch.token_rewards, values, batch.loss_mask, gamma=s.gamma, lam=s.lam)
    return whiten(advantages, batch.loss_mask), returns


def _bilevel_gae(batch: RolloutBatch, values: torch.Tensor | None, s: UpdateSettings
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    advantages, returns = compute_bilevel_gae(batch.token_rewards, values, batch.loss_mask, batch.turn_end_mask,
                                              gamma=s.gamma, lam=s.lam, turn_gamma=s.turn_gamma, turn_lam=s.lam)
    return whiten(advantages, batch.loss_mask), returns


def _grpo(batch: RolloutBatch, values: torch.Tensor | None, s: UpdateSettings) -> tuple[torch.Tensor, torch.Tensor]:
    return compute_grpo_advantages(batch.traj_returns, batch.group_ids, batch.loss_mask, by_std=s.grpo_by_std)


def _rft(batch: RolloutBatch, values: torch.Tensor | None, s: UpdateSettings) -> tuple[torch.Tensor, torch.Tensor]:
    return compute_rft_advantages(batch.loss_mask)


ADVANTAGE_FNS: dict[str, Callable] = {"gae": _gae, "bilevel_gae": _bilevel_gae, "grpo": _grpo, "rft": _rft}


def uses_critic(advantage: str) -> bool:
    """Whether the advantage estimator reads critic values (gae, bilevel_gae), so stages critic_fit and update need
    a critic; grpo and rft do not."""
    if advantage not in ADVANTAGE_FNS:
        raise ValueError(f"unknown algo.advantage {advantage!r}; use one of {', '.join(ADVANTAGE_FNS)}")
    return advantage not in ("grpo", "rft")


def _prefix_len(s: UpdateSettings, input_ids: torch.Tensor, attention_mask: torch.Tensor, loss_mask: torch.Tensor
                ) -> int:
    """Rows behind the same system prompt and instruction run that prefix once (same values, less compute)."""
    return shareable_prefix(input_ids, attention_mask, loss_mask) if s.share_prefix else 0


def micro_batches(lengths: torch.Tensor, start: int, stop: int, *, max_rows: int = 0, max_tokens: int = 0
                  ) -> list[torch.Tensor]:
    """Rows [start, stop) of a batch in passes (row indices), each of at most `max_rows` rows and at most
    `max_tokens` padded tokens (0: no limit); `lengths` (B,) are the rows' real tokens.

        padded tokens of a pass = rows in it x its longest row
    (the width the pass runs at: scoring cuts the padding all its rows share). Without limits: one pass, the rows in
    order. With one, the rows go longest first (ties in row order) and each pass takes them while its limits hold,
    so rows of like length run together and short ones pack densely under a token limit (verl's use_dynamic_bsz
    bounds its passes by tokens as well); a row longer than `max_tokens` runs alone. The longest rows run first,
    so a pass too large for memory fails at once."""
    rows = torch.arange(start, stop)
    if not max_rows and not max_tokens:
        return [rows]
    lengths = lengths.cpu()
    order = rows[torch.argsort(-lengths[start:stop], stable=True)].tolist()
    passes: list[list[int]] = [[]]
    for row in order:
        current = passes[-1]
        longest = int(lengths[current[0]]) if current else 0  # longest first: the pass's first row
        full = bool(current) and ((max_rows and len(current) >= max_rows)
                                  or (max_tokens and (len(current) + 1) * max(longest, int(lengths[row])) > max_tokens))
        if full:
            passes.append([])
        passes[-1].append(row)
    return [torch.tensor(p, dtype=torch.long) for p in passes]


def batch_passes(batch: RolloutBatch, *, max_rows: int, max_tokens: int) -> list[torch.Tensor]:
    """The whole batch in the passes its no-grad scoring runs in (`micro_batches` under these limits)."""
    lengths = batch.attention_mask.sum(-1)  # (B,)
    return micro_batches(lengths, 0, lengths.shape[0], max_rows=max_rows, max_tokens=max_tokens)


def _clip_and_step(optimizer: torch.optim.Optimizer, params, grad_clip: float) -> tuple[float, bool]:
    """Clip the accumulated gradients and step; returns (pre-clip grad norm, whether the step was taken)."""
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, grad_clip))
    if not torch.isfinite(torch.tensor(grad_norm)):
        optimizer.zero_grad(set_to_none=True)
        return grad_norm, False
    optimizer.step()
    return grad_norm, True


@dataclass(frozen=True)
class ScoredBatch:
    """The no-grad pass over a batch before its first optimizer step, which every mini-batch then reads."""

    old_logprobs: torch.Tensor  # (B, T) log pi_old of each token, re-scored by the policy
    old_values: torch.Tensor | None  # (B, T) critic values on masked tokens (zero elsewhere); None without a critic
    advantages: torch.Tensor  # (B, T)
    returns: torch.Tensor  # (B, T) the critic's targets
    sampler_gap: float | None  # largest |re-scored - sampler| log-prob on a sampled token; None when not re-scored


def score_batch(policy: PreTrainedModel, critic: PreTrainedModel | None, batch: RolloutBatch,
                settings: UpdateSettings, *, ref_logprobs: torch.Tensor | None = None) -> ScoredBatch:
    """Old log-probs (and values) of the whole batch and the advantages of `settings.advantage` (RAGEN's
    compute_log_prob / compute_values / compute_advantage, one pass before the mini-batches). With
    `kl_reward_coef` beta and the reference's `ref_logprobs` (B, T), the KL is folded into the rewards first
    (RAGEN V0423 for PPO):  r_t <- r_t - beta * (log pi_old(t) - log pi_ref(t)) on trained tokens.
    `settings.old_logprobs == "sampler"`: log pi_old is the batch's `sampled_logprobs` (set on every sampled token,
    which the assistant loss mask covers exactly), and the policy does not run here."""
    s, mask = settings, batch.loss_mask
    if uses_critic(s.advantage) and critic is None:
        raise ValueError(f"algo.advantage {s.advantage} reads critic values; pass a critic (or use grpo)")
    if s.old_logprobs not in ("rescore", "sampler"):
        raise ValueError(f"unknown old_logprobs {s.old_logprobs!r}; use rescore or sampler")
    rescore = s.old_logprobs == "rescore"
    prefix_len = _prefix_len(s, batch.input_ids, batch.attention_mask, mask)
    passes = batch_passes(batch, max_rows=s.micro_batch_size, max_tokens=s.micro_batch_tokens)  # no-grad passes
    with torch.no_grad():
        old_values = (score_values(critic, batch.input_ids, batch.attention_mask, passes=passes,
                                   prefix_len=prefix_len) * mask if critic is not None else None)
        old_logprobs, gap = batch.sampled_logprobs, None  # (B, T)
        if rescore:
            old_logprobs, _ = score_sequences(policy, batch.input_ids, batch.attention_mask, passes=passes,
                                              with_entropy=False, prefix_len=prefix_len)
            sampled = batch.sampled_logprobs != 0
            gap = (old_logprobs - batch.sampled_logprobs)[sampled].abs().max().item() if sampled.any() else 0.0
    if s.kl_reward_coef and ref_logprobs is not None:
        kl = (old_logprobs - ref_logprobs) * mask  # (B, T) k1 estimate on trained tokens
        batch = replace(batch, token_rewards=batch.token_rewards - s.kl_reward_coef * kl)
    advantages, returns = ADVANTAGE_FNS[s.advantage](batch, old_values, s)
    return ScoredBatch(old_logprobs, old_values, advantages, returns, gap)


def fit_values(critic: PreTrainedModel, optimizer: torch.optim.Optimizer, batch: RolloutBatch, targets: torch.Tensor,
               *, epochs: int, mini_batch_size: int, grad_clip: float, micro_batch_size: int = 0,
               micro_batch_tokens: int = 0) -> list[float]:
    """Warm a critic up: regress V_t onto fixed Monte Carlo targets for `epochs` passes (stage critic_fit).

        L = 0.5 * sum_{b,t} m[b,t] (V(x_<t) - G[b,t])^2 / sum_{b,t} m[b,t]
    per mini-batch of `mini_batch_size` rows, in order, with no value clip (there is no old critic to stay near);
    its gradient accumulated over passes of at most `micro_batch_size` rows and `micro_batch_tokens` padded tokens
    (`micro_batches`, `token_share`; 0 and 0: one pass).
    `targets` (B, T) come from `ragen.advantages.value_targets`. Returns each pass's mean mini-batch loss.
    """
    mask, lengths = batch.loss_mask, batch.attention_mask.sum(-1)  # (B, T), (B,)
    size, losses = batch.input_ids.shape[0], []
    critic.eval()  # no dropout or router noise: the gradients of the values the critic gives (see `update`)
    for _ in range(epochs):
        passes = []
        for start in range(0, size, mini_batch_size):
            stop = min(start + mini_batch_size, size)
            optimizer.zero_grad(set_to_none=True)
            loss_sum = 0.0
            for rows in micro_batches(lengths, start, stop, max_rows=micro_batch_size, max_tokens=micro_batch_tokens):
                ids, att = batch.input_ids[rows], batch.attention_mask[rows]
                values = token_values(critic, ids, att, prefix_len=shareable_prefix(ids, att, mask[rows]))  # (b, T)
                share = token_share(mask[rows], mask[start:stop])
                loss = 0.5 * masked_mean((values - targets[rows]) ** 2, mask[rows]) * share
                loss.backward()
                loss_sum += loss.item()
            torch.nn.utils.clip_grad_norm_(critic.parameters(), grad_clip)
            optimizer.step()
            passes.append(loss_sum)
        losses.append(sum(passes) / len(passes))
    return losses


AGGREGATED_STATS = ("pg_loss", "value_loss")  # the losses themselves, reduced by `aggregation`; every other stat
#   of ppo_clip_loss and value_loss (and the entropy and KL terms) is a mean over masked tokens


def _add_shares(total: dict[str, float], stats: dict[str, float], share: float, tokens: float) -> None:
    """Add one micro-batch's `stats` into its mini-batch's `total`, each weighted by the micro-batch's share of
    what that stat averages over (`aggregation_share` for the losses, `token_share` for token means)."""
    for key, value in stats.items():
        total[key] = total.get(key, 0.0) + value * (share if key in AGGREGATED_STATS else tokens)


def update(policy: PreTrainedModel, critic: PreTrainedModel | None, actor_opt: torch.optim.Optimizer,
           critic_opt: torch.optim.Optimizer | None, batch: RolloutBatch, settings: UpdateSettings, *,
           ref_logprobs: torch.Tensor | None = None, scored: ScoredBatch | None = None) -> dict[str, float]:
    """Critic then actor updates over the batch; returns actor/ and critic/ metrics (means over mini-batches).
    `scored`: the batch's `score_batch` when the caller ran it already (to time it apart); computed here if None.

    Both models stay in eval mode, gradients and all: dropout (GPT-2's 0.1) or MoE router noise (PhiMoE's jitter)
    in the training passes would score tokens other than the old log-probs were scored with, so the first
    mini-batch's ratio would differ from 1 though the policy has not moved, and clipping would act on noise."""
    s = settings
    if uses_critic(s.advantage) and (critic is None or critic_opt is None):
        raise ValueError(f"algo.advantage {s.advantage} reads critic values; pass a critic and its optimizer "
                         "(or use grpo)")
    policy.eval()
    if critic is not None:
        critic.eval()
    scored = scored if scored is not None else score_batch(policy, critic, batch, s, ref_logprobs=ref_logprobs)
    old_logprobs, old_values, advantages, returns = (scored.old_logprobs, scored.old_values, scored.advantages,
                                                     scored.returns)
    mask = batch.loss_mask

    stats: dict[str, list[float]] = {}

    def add(name: str, value: float) -> None:
        stats.setdefault(name, []).append(value)

    size, lengths = batch.input_ids.shape[0], batch.attention_mask.sum(-1)  # lengths (B,)
    critic_epochs = s.critic_epochs or s.epochs
    group_values = group_mean_values(returns, batch.group_ids, mask) if critic is not None else None  # (B, T)
    for epoch in range(max(s.epochs, critic_epochs if critic is not None else 0)):
        for start in range(0, size, s.mini_batch_size):  # each pass in the same order
            stop = min(start + s.mini_batch_size, size)
            m_mini = mask[start:stop]
            micros = micro_batches(lengths, start, stop, max_rows=s.micro_batch_size,  # one optimizer step,
                                   max_tokens=s.micro_batch_tokens)  # gradients accumulated over its passes
            if critic is not None and epoch < critic_epochs:
                critic_opt.zero_grad(set_to_none=True)
                mini: dict[str, float] = {}
                for rows in micros:
                    ids, att, m = batch.input_ids[rows], batch.attention_mask[rows], mask[rows]
                    values = token_values(critic, ids, att, prefix_len=_prefix_len(s, ids, att, m))
                    v_loss, v_stats = value_loss(values, old_values[rows], returns[rows], m, clip=s.value_clip,
                                                 aggregation=s.aggregation)
                    share = aggregation_share(m, m_mini, s.aggregation)
                    (v_loss * share).backward()
                    _add_shares(mini, v_stats, share, token_share(m, m_mini))
                grad_norm, taken = _clip_and_step(critic_opt, critic.parameters(), s.grad_clip)
                for k, v in mini.items():
                    add(f"critic/{k}", v)
                add("critic/grad_norm", grad_norm)
                add("critic/explained_var", explained_variance(old_values[start:stop], returns[start:stop], m_mini))
                add("critic/explained_var_group_mean",
                    explained_variance(group_values[start:stop], returns[start:stop], m_mini))
                add("critic/skipped_steps", float(not taken))
            if epoch >= s.epochs:  # the critic's extra passes
                continue
            actor_opt.zero_grad(set_to_none=True)
            mini = {}
            for rows in micros:
                ids, att, m = batch.input_ids[rows], batch.attention_mask[rows], mask[rows]
                logprobs, entropy = token_logprobs(policy, ids, att, with_entropy=True,
                                                   prefix_len=_prefix_len(s, ids, att, m))
                pg_loss, pg_stats = ppo_clip_loss(logprobs, old_logprobs[rows], advantages[rows], m,
                                                  eps_low=s.eps_low, eps_high=s.eps_high, dual_clip=s.dual_clip,
                                                  aggregation=s.aggregation)
                share, tokens = aggregation_share(m, m_mini, s.aggregation), token_share(m, m_mini)
                entropy_mean = masked_mean(entropy, m)
                loss = share * pg_loss - s.entropy_coef * tokens * entropy_mean
                pg_stats["entropy"] = entropy_mean.item()
                if s.kl_loss is not None and ref_logprobs is not None:
                    kl = masked_mean(kl_penalty(logprobs, ref_logprobs[rows], s.kl_loss), m)
                    loss = loss + s.kl_coef * tokens * kl
                    pg_stats["kl_loss"] = kl.item()
                loss.backward()
                _add_shares(mini, pg_stats, share, tokens)
            grad_norm, taken = _clip_and_step(actor_opt, policy.parameters(), s.grad_clip)
            for k, v in mini.items():
                add(f"actor/{k}", v)
            add("actor/grad_norm", grad_norm)
            add("actor/skipped_steps", float(not taken))
    out = {k: sum(v) / len(v) for k, v in stats.items()}
    for key in ("actor/skipped_steps", "critic/skipped_steps"):
        if key in stats:
            out[key] = sum(stats[key])
    out["actor/lr"] = actor_opt.param_groups[0]["lr"]
    if scored.sampler_gap is not None:
        out["actor/sampler_logprob_gap"] = scored.sampler_gap
    out["actor/advantage_mean"] = masked_mean(advantages, mask).item()
    out["critic/return_mean"] = masked_mean(returns, mask).item()
    return out
