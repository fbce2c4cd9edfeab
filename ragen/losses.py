"""PPO-style losses for StarPO / StarPO-S (RAGEN section 1.7). Every loss returns (loss, stats) with stats detached.

Shapes: B trajectories, T token positions; `loss_mask` (B, T) bool is True on trained tokens. Reductions are
explicit: "token-mean" averages over every masked token of the batch (verl's default); "seq-mean-token-mean"
averages tokens within each trajectory, then trajectories (the paper's eq. 4, 1/G sum_i 1/|tau_i| sum_t).
"""

from __future__ import annotations

import torch

from ragen.advantages import masked_mean


def aggregate(per_token: torch.Tensor, loss_mask: torch.Tensor, mode: str) -> torch.Tensor:
    """Reduce a (B, T) per-token loss to a scalar by `mode` (token-mean | seq-mean-token-mean)."""
    mask = loss_mask.to(per_token.dtype)
    if mode == "token-mean":
        return masked_mean(per_token, mask)
    per_seq = (per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)  # (B,)
    has_tokens = (mask.sum(-1) > 0).to(per_token.dtype)
    return (per_seq * has_tokens).sum() / has_tokens.sum().clamp(min=1.0)


def token_share(part_mask: torch.Tensor, whole_mask: torch.Tensor) -> float:
    """The share of the whole batch's masked tokens that a micro-batch holds: n_tok(part) / n_tok(whole) (0 for an
    empty whole). A masked mean over the part times its share, summed over the parts, is the whole's masked mean."""
    return float(part_mask.sum()) / max(float(whole_mask.sum()), 1.0)


def aggregation_share(part_mask: torch.Tensor, whole_mask: torch.Tensor, mode: str) -> float:
    """The weight w of a micro-batch's `aggregate` in its mini-batch's, so that gradient accumulation is exact:

        aggregate(x, M, mode) = sum_k w_k * aggregate(x[rows_k], M[rows_k], mode)
        token-mean:           w_k = n_tok(M[rows_k]) / n_tok(M)
        seq-mean-token-mean:  w_k = n_seq(M[rows_k]) / n_seq(M),  n_seq counting rows with a masked token
    (`part_mask` (b, T) holds rows of `whole_mask` (B, T)). verl instead averages the micro-batches' own means
    (w_k = b / B), which makes its token-mean depend on the micro-batch size; here the micro-batch size only
    bounds memory."""
    if mode == "token-mean":
        return token_share(part_mask, whole_mask)
    if mode == "seq-mean-token-mean":
        return float((part_mask.sum(-1) > 0).sum()) / max(float((whole_mask.sum(-1) > 0).sum()), 1.0)
    raise ValueError(f"unknown aggregation {mode!r}; use token-mean or seq-mean-token-mean")


def ppo_clip_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                  loss_mask: torch.Tensor, *, eps_low: float, eps_high: float, dual_clip: float | None = None,
                  aggregation: str = "token-mean") -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped surrogate with decoupled clip range (PPO eq. 7; DAPO's clip-higher; RAGEN StarPO-S).

        r_t = exp(logp_t - logp_old_t)
        pg_t = max(-A_t r_t, -A_t clip(r_t, 1 - eps_low, 1 + eps_high))
        dual clip (A_t < 0 only): pg_t = min(pg_t, -c A_t)

    Stats: clipfrac_high (r > 1 + eps_high with A > 0, the upper clip binding), clipfrac_low (r < 1 - eps_low
    with A < 0), approx_kl = token-mean(logp_old - logp) (k1 estimate of KL(old || new)).
    """
    log_ratio = logprobs - old_logprobs  # (B, T)
    ratio = torch.exp(log_ratio)  # (B, T)
    clipped_ratio = ratio.clamp(1.0 - eps_low, 1.0 + eps_high)  # (B, T)
    pg = torch.maximum(-advantages * ratio, -advantages * clipped_ratio)  # (B, T)
    dual_clipped = torch.zeros_like(pg, dtype=torch.bool)
    if dual_clip is not None:
        capped = torch.minimum(pg, -dual_clip * advantages)
        dual_clipped = (advantages < 0) & (capped < pg)
        pg = torch.where(advantages < 0, capped, pg)
    loss = aggregate(pg, loss_mask, aggregation)
    with torch.no_grad():
        mask = loss_mask.float()
        stats = {
            "pg_loss": loss.item(),
            "clipfrac_high": masked_mean(((ratio > 1 + eps_high) & (advantages > 0)).float(), mask).item(),
            "clipfrac_low": masked_mean(((ratio < 1 - eps_low) & (advantages < 0)).float(), mask).item(),
            "clipfrac_dual": masked_mean(dual_clipped.float(), mask).item(),
            "approx_kl": masked_mean(-log_ratio, mask).item(),
            "ratio_mean": masked_mean(ratio, mask).item(),
        }
    return loss, stats


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token KL(pi || pi_ref) estimates (Schulman 2020): k1 = logp - logp_ref; k3 = exp(-k1) - 1 + k1 >= 0."""
    k1 = logprobs - ref_logprobs  # (B, T)
    if kind == "k1":
        return k1
    if kind == "k3":
        return torch.exp(-k1) - 1 + k1
    raise ValueError(f"unknown KL estimator {kind!r}; use k1 or k3")


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, loss_mask: torch.Tensor, *,
               clip: float, aggregation: str = "token-mean") -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped value loss (verl / RAGEN critic): 0.5 * mean(max((V - G)^2, (clip(V, V_old - c, V_old + c) - G)^2))."""
    clipped = old_values + (values - old_values).clamp(-clip, clip)  # (B, T)
    unclipped_sq = (values - returns) ** 2
    clipped_sq = (clipped - returns) ** 2
    loss = 0.5 * aggregate(torch.maximum(unclipped_sq, clipped_sq), loss_mask, aggregation)
    with torch.no_grad():
        stats = {"value_loss": loss.item(),
                 "value_clipfrac": masked_mean((clipped_sq > unclipped_sq).float(), loss_mask).item(),
                 "value_mean": masked_mean(values, loss_mask).item()}
    return loss, stats


def explained_variance(values: torch.Tensor, returns: torch.Tensor, loss_mask: torch.Tensor) -> float:
    """1 - Var[G - V] / Var[G] over masked tokens (1 is a perfect critic, 0 no better than a constant)."""
    mask = loss_mask.bool()
    v, g = values[mask].float(), returns[mask].float()
    if g.numel() < 2 or g.var() < 1e-8:  # constant returns: nothing to explain
        return float("nan")
    return float(1 - (g - v).var() / g.var())
