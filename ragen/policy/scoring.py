"""Per-token log-probs, entropies and values of given sequences (the training-side view of a rollout).

Shapes: B sequences, T token positions, V vocabulary. Everything is aligned to the tokens: position t holds the
quantity for token t given tokens < t, so position 0 (no prefix) is 0. Sequences are left-padded; position ids
count real tokens only (cumsum(mask) - 1), matching sampling.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, T) 0/1 mask -> (B, T) positions that start at 0 on the first real token (left padding)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def token_logprobs(model: PreTrainedModel, input_ids: torch.Tensor, attention_mask: torch.Tensor, *,
                   with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log pi(x_t | x_<t) and, optionally, the entropy of pi(. | x_<t), for every token; differentiable.

        logprobs[b, t] = log_softmax(logits[b, t - 1])[x[b, t]],   entropy[b, t] = -sum_v p_v log p_v

    Args:
        input_ids: (B, T) token ids, left padded.
        attention_mask: (B, T) 1 on real tokens.
    Returns:
        logprobs (B, T) and entropy (B, T) or None; position 0 is 0.
    """
    out = model(input_ids=input_ids, attention_mask=attention_mask,
                position_ids=position_ids_from_mask(attention_mask), use_cache=False)
    logits = out.logits[:, :-1].float()  # (B, T-1, V): predicts tokens 1..T-1
    logp_all = F.log_softmax(logits, dim=-1)  # (B, T-1, V)
    logprobs = logp_all.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)  # (B, T-1)
    logprobs = F.pad(logprobs, (1, 0))  # (B, T)
    entropy = None
    if with_entropy:
        entropy = -(logp_all.exp() * logp_all).sum(-1)  # (B, T-1)
        entropy = F.pad(entropy, (1, 0))  # (B, T)
    return logprobs, entropy


@torch.no_grad()
def score_sequences(model: PreTrainedModel, input_ids: torch.Tensor, attention_mask: torch.Tensor, *,
                    micro_batch: int = 16, with_entropy: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`token_logprobs` without gradients, in micro-batches to bound the (b, T, V) logits memory."""
    logprobs, entropies = [], []
    for start in range(0, input_ids.shape[0], micro_batch):
        lp, ent = token_logprobs(model, input_ids[start : start + micro_batch],
                                 attention_mask[start : start + micro_batch], with_entropy=with_entropy)
        logprobs.append(lp)
        entropies.append(ent)
    return torch.cat(logprobs), (torch.cat(entropies) if with_entropy else None)


def token_values(critic: PreTrainedModel, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """V(x_<=t) for every token: the critic's scalar head at position t (the state after reading token t).

    Returns (B, T) float32, differentiable.
    """
    out = critic(input_ids=input_ids, attention_mask=attention_mask,
                 position_ids=position_ids_from_mask(attention_mask))
    return out.logits.squeeze(-1).float()  # (B, T)
