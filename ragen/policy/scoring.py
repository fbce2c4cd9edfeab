"""Per-token log-probs, entropies and values of given sequences (the training-side view of a rollout).

Shapes: B sequences, T token positions, V vocabulary. Everything is aligned to the tokens: position t holds the
quantity for token t given tokens < t, so position 0 (no prefix) is 0. Sequences are left-padded; position ids
count real tokens only (cumsum(mask) - 1), matching sampling.

Left padding is exact for recurrent layers too (Qwen3.5's linear attention, Jamba's Mamba layers, LFM2's
convolutions): they zero masked inputs, and zeros ahead of the first real token leave their state at its start.
What they cannot do is skip a masked position between real tokens (`has_recurrent_layers`).
"""

from __future__ import annotations

import inspect
import sys
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import get_layer_types_and_kwargs

from ragen.policy.model import backbone, computing, value_head


# cache layer types (transformers' `config.layer_types`) that carry a state updated at every position fed
RECURRENT_LAYER_TYPES = frozenset({"linear_attention", "conv", "hybrid", "hybrid_sliding"})
# those that keep plain keys and values, which `_broadcast_cache` can share across rows (no layer_types: all full)
PLAIN_ATTENTION_TYPES = frozenset({"full_attention", "sliding_attention", "chunked_attention"})


def _layer_types(model: PreTrainedModel) -> set[str]:
    config = model.config.get_text_config(decoder=True)
    return set(getattr(config, "layer_types", None) or ("full_attention",))


def has_recurrent_layers(model: PreTrainedModel) -> bool:
    """Whether some layer keeps a recurrent state (a convolution window, linear attention, an SSM) rather than
    keys and values. Such a layer reads every position it is fed: a masked position decays its state and shifts its
    convolution window though its input is zeroed, so a masked hole between two real tokens changes everything
    after it, where attention would skip it."""
    return bool(RECURRENT_LAYER_TYPES & _layer_types(model))


def attention_window(model: PreTrainedModel) -> int | None:
    """The fewest cache slots a layer attends over (a sliding window, Llama 4's attention chunks, GPT-Neo's local
    layers, DeepSeek-V4's window beside its compressed keys), or None when every layer sees the whole cache. A
    window counts slots, not positions: a masked hole between real tokens takes a slot and pushes a real key out of
    the window, where a fresh pass would still see it (left padding ahead of the first real token does not:
    transformers measures chunks from it). A cache no longer than the window loses no key this way."""
    config = model.config.get_text_config(decoder=True)
    windows = [kwargs.get("sliding_window") or getattr(kwargs.get("config"), "sliding_window", None)  # DeepSeek-V4's
               for kwargs in get_layer_types_and_kwargs(config)[1]]  # compressed layers carry their own config
    windows = [window for window in windows if window]
    if "local" in (getattr(config, "attention_layers", None) or ()):  # GPT-Neo's local layers, outside layer_types
        windows.append(config.window_size)
    return min(windows, default=None)


def exact_context(model: PreTrainedModel) -> int:
    """The longest sequence the model samples and scores exactly: its max_position_embeddings (MPT's max_seq_len;
    Bloom has none), or for longrope (Phi-3, Phi-3.5, Phi-4-mini) its original_max_position_embeddings. Past that,
    longrope switches its rotary factors for every row of a forward at once, by the batch's largest position: keys
    cached before the switch, and a row run beside a longer one, no longer match a fresh pass of the row."""
    config = model.config.get_text_config(decoder=True)
    rope = getattr(config, "rope_parameters", None) or {}
    kinds = list(rope.values()) if rope and all(isinstance(v, dict) for v in rope.values()) else [rope]  # per layer
    switches = [kind.get("original_max_position_embeddings") or getattr(config, "original_max_position_embeddings", 0)
                for kind in kinds if kind.get("rope_type") == "longrope"]
    limits = [getattr(config, key, None) for key in ("max_position_embeddings", "max_seq_len")]  # MPT: max_seq_len
    return min((limit for limit in limits + switches if limit), default=sys.maxsize)  # Bloom's ALiBi: no limit


def broadcasts_prefix(model: PreTrainedModel, prefix_len: int) -> bool:
    """Whether a shared prefix of `prefix_len` tokens can be run once and its cache broadcast to every row: every
    layer keeps plain keys and values, and the prefix fits in every layer's window (a windowed layer's cache keeps
    its last window - 1 keys; the window itself then applies to the rows' own tokens as in the full pass). Not
    recurrent layers, nor DeepSeek-V3.2's and V4's indexed or compressed attention caches; those rows run whole (the
    same values)."""
    window = attention_window(model)
    return _layer_types(model) <= PLAIN_ATTENTION_TYPES and (window is None or prefix_len < window)


def skips_masked_positions(model: PreTrainedModel) -> bool:
    """Whether a masked position between real tokens leaves the model's outputs as if it were not there: true of
    attention placed by the position ids we pass; false with recurrent layers (`has_recurrent_layers`) and for a
    model that takes no position ids and places tokens by their index (MPT's ALiBi), where a hole adds distance."""
    takes_positions = "position_ids" in inspect.signature(type(model).forward).parameters
    return takes_positions and not has_recurrent_layers(model)


def shared_padding(attention_mask: torch.Tensor) -> int:
    """How many leading columns of a left-padded (B, T) mask are padding in every row. A slice of a batch (a
    micro-batch, a single row) keeps the batch's width; these columns change no real token's output (positions
    count real tokens, and a padded key is masked), so the model need not run them."""
    real = attention_mask.any(0).nonzero()
    return int(real[0]) if len(real) else 0


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, T) 0/1 mask -> (B, T) positions that start at 0 on the first real token (left padding)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def token_logprobs(model: PreTrainedModel, input_ids: torch.Tensor, attention_mask: torch.Tensor, *,
                   with_entropy: bool = False, prefix_len: int = 0) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log pi(x_t | x_<t) and, optionally, the entropy of pi(. | x_<t), for every token; differentiable.

        logprobs[b, t] = log_softmax(logits[b, t - 1])[x[b, t]],   entropy[b, t] = -sum_v p_v log p_v

    Args:
        input_ids: (B, T) token ids, left padded.
        attention_mask: (B, T) 1 on real tokens.
        prefix_len: Lp > 0 runs the first Lp real tokens, which every row must share, once for all rows
            (`token_logprobs_shared_prefix`; take it from `shareable_prefix`); 0 runs every row whole. A model
            whose cache cannot be broadcast (`broadcasts_prefix`) runs every row whole either way (the same values).
    Returns:
        logprobs (B, T) and entropy (B, T) or None; 0 at position 0, on the padding every row shares and (with
        `prefix_len`) on the prefix.
    """
    if prefix_len and broadcasts_prefix(model, prefix_len):
        with computing(model):
            return token_logprobs_shared_prefix(model, input_ids, attention_mask, prefix_len,
                                                with_entropy=with_entropy)
    lead = shared_padding(attention_mask)  # columns that are padding in every row: not run
    ids, att = input_ids[:, lead:], attention_mask[:, lead:]
    with computing(model):
        out = model(input_ids=ids, attention_mask=att, position_ids=position_ids_from_mask(att), use_cache=False)
    logits = out.logits[:, :-1].float()  # (B, T'-1, V): predicts tokens 1..T'-1 of the run columns
    logprobs, entropy = _logprobs_of(logits, ids[:, 1:], with_entropy)  # (B, T'-1) each
    logprobs, entropy = F.pad(logprobs, (1 + lead, 0)), (F.pad(entropy, (1 + lead, 0)) if with_entropy else None)
    if prefix_len:  # a cache that cannot be broadcast (`broadcasts_prefix`): every row ran whole; zero the prefix
        shared = ~_own_tokens(attention_mask, prefix_len)  # (B, T)
        logprobs, entropy = logprobs.masked_fill(shared, 0.0), (entropy.masked_fill(shared, 0.0) if with_entropy
                                                                else None)
    return logprobs, entropy


def _own_tokens(attention_mask: torch.Tensor, prefix_len: int) -> torch.Tensor:
    """(B, T) True on each row's real tokens after its first `prefix_len`, False on the shared prefix and padding."""
    return (attention_mask.long().cumsum(-1) > prefix_len) & attention_mask.bool()


def _logprobs_of(logits: torch.Tensor, targets: torch.Tensor, with_entropy: bool
                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(B, L, V) float logits and (B, L) next tokens -> (B, L) log-probs of those tokens and (B, L) entropies."""
    logp_all = F.log_softmax(logits, dim=-1)  # (B, L, V)
    logprobs = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (B, L)
    entropy = -(logp_all.exp() * logp_all).sum(-1) if with_entropy else None  # (B, L)
    return logprobs, entropy


def in_passes(score: Callable[[torch.Tensor], tuple[torch.Tensor | None, ...]], rows: int,
              passes: Sequence[torch.Tensor] | None) -> tuple[torch.Tensor | None, ...]:
    """`score(index)` -> a tuple of (b, T) tensors (or None) for each pass of row indices, each put back in row
    order: (rows, T). `passes` None: runs of 16 consecutive rows (the default that bounds the (b, T, V) logits)."""
    passes = passes if passes is not None else [torch.arange(s, min(s + 16, rows)) for s in range(0, rows, 16)]
    outs: list[torch.Tensor | None] | None = None
    for index in passes:
        parts = score(index)  # each (b, T) or None
        if outs is None:
            outs = [None if part is None else part.new_zeros((rows, *part.shape[1:])) for part in parts]
        for out, part in zip(outs, parts):
            if out is not None:
                out[index.to(out.device)] = part
    return tuple(outs)


@torch.no_grad()
def score_sequences(model: PreTrainedModel, input_ids: torch.Tensor, attention_mask: torch.Tensor, *,
                    passes: Sequence[torch.Tensor] | None = None, with_entropy: bool = True, prefix_len: int = 0
                    ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`token_logprobs` without gradients, pass by pass (row indices, e.g. `ragen.update.micro_batches`; see
    `in_passes`) to bound the (b, T, V) logits memory; `prefix_len` (the whole batch's `shareable_prefix`) runs
    that prefix once per pass. Returns (B, T) log-probs and entropies (None without)."""
    return in_passes(lambda index: token_logprobs(model, input_ids[index], attention_mask[index],
                                                  with_entropy=with_entropy, prefix_len=prefix_len),
                     input_ids.shape[0], passes)


def token_values(critic: PreTrainedModel, input_ids: torch.Tensor, attention_mask: torch.Tensor, *,
                 prefix_len: int = 0) -> torch.Tensor:
    """V(x_<t) for every token t: the value of the state in which token t is chosen, aligned like `token_logprobs`.

        values[b, t] = head(h[b, t - 1]),   values[b, 0] = 0
    The critic's head at position t - 1 has read x_<t but not x_t, so the baseline of token t never sees the token
    it judges (verl takes the values one position before each response token for the same reason). A value read
    after x_t would absorb the action's own effect: with a perfect critic, A_t = G - V would carry no signal about
    choosing x_t.

    `prefix_len` Lp > 0 runs the shared first Lp real tokens once (`token_values_shared_prefix`; whole rows where
    `broadcasts_prefix` is false, with the same values).

    Returns (B, T) float32, differentiable.
    """
    if prefix_len and broadcasts_prefix(critic, prefix_len):
        with computing(critic):
            return token_values_shared_prefix(critic, input_ids, attention_mask, prefix_len)
    lead = shared_padding(attention_mask)  # columns that are padding in every row: not run
    att = attention_mask[:, lead:]
    with computing(critic):
        out = critic(input_ids=input_ids[:, lead:], attention_mask=att, position_ids=position_ids_from_mask(att))
    values = out.logits.squeeze(-1).float()  # (B, T'): head(h_t), the state after reading token t
    values = F.pad(values[:, :-1], (1 + lead, 0))  # (B, T): shifted so position t holds head(h_{t-1})
    return values.masked_fill(~_own_tokens(attention_mask, prefix_len), 0.0) if prefix_len else values


@torch.no_grad()
def score_values(critic: PreTrainedModel, input_ids: torch.Tensor, attention_mask: torch.Tensor, *,
                 passes: Sequence[torch.Tensor] | None = None, prefix_len: int = 0) -> torch.Tensor:
    """`token_values` without gradients, pass by pass as in `score_sequences`, to bound the activations' memory;
    `prefix_len` as there. Returns (B, T)."""
    return in_passes(lambda index: (token_values(critic, input_ids[index], attention_mask[index],
                                                 prefix_len=prefix_len),), input_ids.shape[0], passes)[0]


def shared_prefix_length(input_ids: torch.Tensor, attention_mask: torch.Tensor, loss_mask: torch.Tensor) -> int:
    """How many leading real tokens every row has in common, stopping before any row's first loss token and
    leaving every row at least one token of its own. Rows are left padded: (B, T) each."""
    lengths = attention_mask.sum(-1)  # (B,)
    width = input_ids.shape[1]
    real = [input_ids[b, width - int(n):] for b, n in enumerate(lengths)]  # each (n_b,)
    losses = [loss_mask[b, width - int(n):] for b, n in enumerate(lengths)]
    limit = min(int(n) - 1 for n in lengths)
    for row_loss in losses:
        hits = row_loss.nonzero()
        if len(hits):
            limit = min(limit, int(hits[0]))
    first = real[0][:limit]
    same = torch.ones(limit, dtype=torch.bool, device=input_ids.device)
    for row in real[1:]:
        same &= row[:limit] == first
    return limit if bool(same.all()) else int((~same).nonzero()[0])


MIN_SHARED_PREFIX = 16  # tokens; a shorter shared prefix is not worth a second model call


def shareable_prefix(input_ids: torch.Tensor, attention_mask: torch.Tensor, loss_mask: torch.Tensor) -> int:
    """The `prefix_len` worth passing to `token_logprobs` / `token_values` for these rows: `shared_prefix_length`
    when there are several rows and it is at least MIN_SHARED_PREFIX tokens, else 0 (run every row whole)."""
    if input_ids.shape[0] < 2:
        return 0
    length = shared_prefix_length(input_ids, attention_mask, loss_mask)
    return length if length >= MIN_SHARED_PREFIX else 0


def _split_prefix(input_ids: torch.Tensor, attention_mask: torch.Tensor, prefix_len: int
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, list[int]]:
    """Left-padded rows -> the shared prefix (1, Lp), each row's own suffix right padded (B, Ls), the attention
    mask over prefix and suffix (B, Lp + Ls), the suffix positions (B, Ls) and each row's suffix length."""
    batch, width = input_ids.shape
    lengths = [int(n) for n in attention_mask.sum(-1)]  # real tokens per row
    own = [n - prefix_len for n in lengths]  # suffix tokens per row (>= 1)
    prefix = input_ids[:1, width - lengths[0]: width - lengths[0] + prefix_len]  # (1, Lp)
    suffix = torch.zeros((batch, max(own)), dtype=torch.long, device=input_ids.device)  # (B, Ls) right padded
    suffix_mask = torch.zeros_like(suffix)
    for b, n in enumerate(own):
        suffix[b, :n] = input_ids[b, width - n:]
        suffix_mask[b, :n] = 1
    mask = torch.cat([torch.ones((batch, prefix_len), dtype=torch.long, device=input_ids.device), suffix_mask], -1)
    positions = (prefix_len + torch.arange(suffix.shape[1], device=input_ids.device)).expand(batch, -1)  # (B, Ls)
    return prefix, suffix, mask, positions, own


def _broadcast_cache(past, batch: int) -> DynamicCache:
    """The prefix's keys and values for every row (expanded, not copied: their gradients add up)."""
    cache = DynamicCache()
    for layer, kv in enumerate(past.layers):
        cache.update(kv.keys.expand(batch, -1, -1, -1), kv.values.expand(batch, -1, -1, -1), layer)
    return cache


def _unsplit(per_suffix: torch.Tensor, own: list[int], width: int) -> torch.Tensor:
    """(B, Ls) per-suffix-token values -> (B, T) at the rows' left-padded positions, 0 elsewhere."""
    return torch.stack([F.pad(per_suffix[b, :n], (width - n, 0)) for b, n in enumerate(own)])


def token_logprobs_shared_prefix(model: PreTrainedModel, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                                 prefix_len: int, *, with_entropy: bool = False
                                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`token_logprobs` for rows that all begin with the same `prefix_len` real tokens, computed with the prefix
    run once: its keys and values are shared by every row (broadcast, so their gradients add up), and only each
    row's own suffix runs per row. Same values as the full pass; for a batch of B conversations behind one
    system prompt and instruction it costs about Lp + B * Ls tokens instead of B * (Lp + Ls).

    Args:
        input_ids: (B, T) left padded; attention_mask: (B, T).
        prefix_len: Lp, at most `shared_prefix_length(...)`.
    Returns:
        (B, T) log pi(x_t | x_<t), differentiable, and (B, T) entropies or None; 0 on padding and on the prefix
        (t < Lp), whose tokens the caller must not train on.
    """
    batch, width = input_ids.shape
    prefix, suffix, mask, positions, own = _split_prefix(input_ids, attention_mask, prefix_len)
    head = model(input_ids=prefix, use_cache=True, logits_to_keep=1)  # only the last position predicts a suffix token
    tail = model(input_ids=suffix, attention_mask=mask, position_ids=positions,
                 past_key_values=_broadcast_cache(head.past_key_values, batch), use_cache=True)
    # the suffix's first token is predicted by the prefix's last position, the others by the suffix itself
    first = _logprobs_of(head.logits[:, -1:].float().expand(batch, -1, -1), suffix[:, :1], with_entropy)  # (B, 1)
    rest = _logprobs_of(tail.logits[:, :-1].float(), suffix[:, 1:], with_entropy)  # (B, Ls - 1) each
    logprobs = _unsplit(torch.cat([first[0], rest[0]], 1), own, width)  # (B, T)
    return logprobs, (_unsplit(torch.cat([first[1], rest[1]], 1), own, width) if with_entropy else None)


def token_values_shared_prefix(critic: PreTrainedModel, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                               prefix_len: int) -> torch.Tensor:
    """`token_values` with the shared prefix run once, as in `token_logprobs_shared_prefix`: V(x_<t) for each
    suffix token, the first one's from the prefix's last hidden state. (B, T) float32, differentiable; 0 on padding
    and on the prefix."""
    batch, width = input_ids.shape
    prefix, suffix, mask, positions, own = _split_prefix(input_ids, attention_mask, prefix_len)
    head = backbone(critic)(input_ids=prefix, use_cache=True)  # (1, Lp, H)
    tail = critic(input_ids=suffix, attention_mask=mask, position_ids=positions,
                  past_key_values=_broadcast_cache(head.past_key_values, batch), use_cache=True)
    first = value_head(critic)(head.last_hidden_state[:, -1:]).float().expand(batch, -1, -1)  # (B, 1, 1)
    values = torch.cat([first, tail.logits[:, :-1].float()], 1).squeeze(-1)  # (B, Ls): head(h_{t-1})
    return _unsplit(values, own, width)
