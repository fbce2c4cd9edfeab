"""Batched sampling with a KV cache, returning the sampled token ids and their log-probs.

Token in, token out: training later scores exactly these ids, so rollout and training never disagree on tokens.
The returned log-prob of each token is the policy's, log softmax(logits) at temperature 1 over the full
vocabulary, whatever temperature / top-p / top-k shaped the draw; it equals a re-scoring of the same ids.

Loop: left-pad the prompts, one prefill pass that fills the cache, then one token per step for every sequence
still running; a sequence stops at an end-of-turn token, when its text contains a stop string (e.g.
"</answer>"), or after `max_new_tokens`. Finished sequences keep feeding padding until all are done.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ragen.policy.scoring import position_ids_from_mask

STOP_TAIL_CHARS = 32


@dataclass(frozen=True)
class Sample:
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish: str  # "stop" (stop string), "eos" (end-of-turn token, included in token_ids) or "length"


class TokenTexts:
    """Each token's own text, computed once per tokenizer, for stop-string checks without decoding."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.texts = tokenizer.batch_decode([[i] for i in range(len(tokenizer))], skip_special_tokens=False)
        self.stop_ids = {i for i in (tokenizer.eos_token_id, tokenizer.pad_token_id,
                                     tokenizer.convert_tokens_to_ids("<|im_end|>")) if isinstance(i, int) and i >= 0}
        self.pad_id = tokenizer.pad_token_id


def filter_logits(logits: torch.Tensor, *, top_k: int, top_p: float) -> torch.Tensor:
    """Keep the top_k largest logits (0 = all) and the smallest set whose probability reaches top_p; -inf elsewhere.

    Args:
        logits: (B, V), already divided by the temperature.
    """
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)  # (B, V)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        drop_sorted = cumulative - sorted_logits.softmax(-1) >= top_p  # mass before this token already >= top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """-> input_ids (B, L), attention_mask (B, L), left padded to the longest prompt."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
        mask[row, width - len(prompt) :] = 1
    return ids.to(device), mask.to(device)


@torch.no_grad()
def sample(model: PreTrainedModel, token_texts: TokenTexts, prompts: Sequence[Sequence[int]], *,
           max_new_tokens: int, temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0,
           stop_strings: Sequence[str] = ("</answer>",), generator: torch.Generator | None = None) -> list[Sample]:
    """Sample one continuation per prompt (see the module docstring). temperature 0 is greedy."""
    if not prompts:
        return []
    device = model.device
    input_ids, mask = left_pad(prompts, token_texts.pad_id, device)  # (B, L)
    batch = input_ids.shape[0]
    out = model(input_ids=input_ids, attention_mask=mask, position_ids=position_ids_from_mask(mask),
                use_cache=True, logits_to_keep=1)
    cache, logits = out.past_key_values, out.logits[:, -1].float()  # (B, V)
    positions = mask.sum(-1, keepdim=True) - 1  # (B, 1): position of the last prompt token

    tokens: list[list[int]] = [[] for _ in range(batch)]
    logprobs: list[list[float]] = [[] for _ in range(batch)]
    tails = [""] * batch
    finish = ["length"] * batch
    running = torch.ones(batch, dtype=torch.bool, device=device)
    for _ in range(max_new_tokens):
        policy_logp = F.log_softmax(logits, dim=-1)  # (B, V) at temperature 1
        if temperature <= 0:
            next_ids = logits.argmax(-1)  # (B,)
        else:
            shaped = filter_logits(logits / temperature, top_k=top_k, top_p=top_p)
            next_ids = torch.multinomial(shaped.softmax(-1), 1, generator=generator).squeeze(-1)  # (B,)
        chosen_logp = policy_logp.gather(-1, next_ids.unsqueeze(-1)).squeeze(-1)  # (B,)

        ids_list, logp_list = next_ids.tolist(), chosen_logp.tolist()
        for row in running.nonzero().flatten().tolist():
            token = ids_list[row]
            tokens[row].append(token)
            logprobs[row].append(logp_list[row])
            if token in token_texts.stop_ids:
                finish[row] = "eos"
                running[row] = False
                continue
            tails[row] = (tails[row] + token_texts.texts[token])[-STOP_TAIL_CHARS:]
            if any(stop in tails[row] for stop in stop_strings):
                finish[row] = "stop"
                running[row] = False
        if not running.any():
            break
        feed = torch.where(running, next_ids, torch.full_like(next_ids, token_texts.pad_id)).unsqueeze(-1)  # (B, 1)
        mask = torch.cat([mask, torch.ones((batch, 1), dtype=mask.dtype, device=device)], dim=-1)  # (B, L + t)
        positions = positions + 1
        out = model(input_ids=feed, attention_mask=mask, position_ids=positions, past_key_values=cache, use_cache=True)
        cache, logits = out.past_key_values, out.logits[:, -1].float()
    return [Sample(tuple(t), tuple(lp), f) for t, lp, f in zip(tokens, logprobs, finish)]
