"""Batched sampling with a KV cache, returning the sampled token ids and their log-probs.

Token in, token out: training later scores exactly these ids, so rollout and training never disagree on tokens.
The returned log-prob of each token is the policy's, log softmax(logits) at temperature 1 over the full
vocabulary, whatever temperature / top-p / top-k shaped the draw; it equals a re-scoring of the same ids.

Loop: left-pad the prompts, one prefill pass that fills the cache (once per distinct prompt), then one token per
step for every sequence still running; a sequence stops at an end-of-turn token, when its text contains a stop
string (e.g. "</answer>"), or after `max_new_tokens`. Finished sequences keep feeding padding until all are done.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F
from transformers import Cache, PreTrainedModel, PreTrainedTokenizerBase

from ragen.policy.model import computing
from ragen.policy.scoring import attention_window, position_ids_from_mask, skips_masked_positions

STOP_TAIL_CHARS = 32


@dataclass(frozen=True)
class Sample:
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish: str  # "stop" (stop string), "eos" (end-of-turn token, included in token_ids) or "length"


class TokenTexts:
    """Each token's own text, computed once per tokenizer, for stop-string checks without decoding."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, extra_stop_ids: Sequence[int] = ()) -> None:
        """`extra_stop_ids`: the model's own end tokens (its generation config's eos_token_id), e.g. Llama 3's
        <|eot_id|> where the tokenizer's eos is <|end_of_text|>."""
        self.texts = tokenizer.batch_decode([[i] for i in range(len(tokenizer))], skip_special_tokens=False)
        # ChatML's turn end where the vocabulary has it (convert_tokens_to_ids would give <unk> elsewhere)
        candidates = (tokenizer.eos_token_id, tokenizer.pad_token_id, tokenizer.get_vocab().get("<|im_end|>"),
                      *extra_stop_ids)
        self.stop_ids = {i for i in candidates if isinstance(i, int) and 0 <= i < len(self.texts)}
        self.pad_id = tokenizer.pad_token_id

    def text(self, token: int) -> str:
        """The token's text; "" for an output row past the tokenizer's ids, as the tokenizer decodes it. Checkpoints
        pad their output rows to a round number (Qwen2.5-0.5B-Instruct: 151,936 rows for 151,665 tokens), and a
        sampler draws from every row."""
        return self.texts[token] if token < len(self.texts) else ""


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


class SamplingSession:
    """Sampling for a fixed set of rows (episodes) whose prompts grow turn by turn; the KV cache is kept.

    Each call passes, for some rows, the row's whole sequence so far; it must extend what the row was fed
    before. Only the new suffix is run through the model: turn k of a multi-turn episode costs the new user
    message, not the whole conversation again (RAGEN re-sends everything each turn). New suffixes of different
    lengths sit left-aligned-with-holes in one chunk: masked positions inside a row, with position ids counting
    real tokens only, so results equal a fresh pass over each row's sequence. Rows not in a call just wait.

    Two savings keep the batch to the work that is left. A first call that feeds every row runs each distinct
    prompt once and copies its cache to the rows that share it (the N rollouts of a group start from one
    prompt). `release(rows)` drops finished rows from the cache, so later turns run only the rows still playing.

    A model with recurrent layers (Qwen3.5, Jamba, Falcon-H1, LFM2: a masked position still moves their state) or
    one that places tokens by their index (MPT) cannot take the holes (`skips_masked_positions`). There every call
    starts a fresh cache over the rows it samples, fed their whole sequences left padded (as RAGEN does every turn),
    so no real token ever follows a hole; the holes that finished sequences get while the others decode end with
    the call. A model that attends over a window of cache slots (sliding-window or chunked layers: Mistral, Gemma 2
    and 3, GPT-OSS, Phi-3, Llama 4; `attention_window`) takes the holes only while the cache cannot outgrow the
    window; a call that could make it longer feeds whole sequences the same way. A row that sits out a call that
    starts a fresh cache is not in it: the next call that samples it starts a fresh cache as well.
    """

    def __init__(self, model: PreTrainedModel, token_texts: TokenTexts, rows: int) -> None:
        self.model, self.texts = model, token_texts
        self.refeed = not skips_masked_positions(model)  # every call feeds its rows' whole sequences
        self.window = attention_window(model)  # slots a layer attends over (None: all): calls past it refeed
        self.fed: list[list[int] | None] = [[] for _ in range(rows)]  # tokens in the cache per row; None: released
        self.order = list(range(rows))  # the live rows, in the order of the cache's batch dimension
        self.cache = None
        self.mask = torch.zeros((rows, 0), dtype=torch.long, device=model.device)  # (live rows, cache length)

    def release(self, rows: Sequence[int]) -> None:
        """Drop these rows (e.g. finished episodes) from the cache; a released row cannot be sampled again."""
        gone = set(rows)
        keep = [b for b, row in enumerate(self.order) if row not in gone]
        if len(keep) == len(self.order):
            return
        for row in gone:
            self.fed[row] = None
        if self.refeed or (self.window is not None and self.mask.shape[1] >= self.window):
            self.cache = None  # the next call starts a fresh cache anyway: drop this one rather than reorder it
        self._select(keep)
        self.order = [self.order[b] for b in keep]

    def _select(self, index: Sequence[int]) -> None:
        """Rebuild the cache's batch from these batch entries, in this order (an entry may repeat)."""
        index_t = torch.tensor(index, dtype=torch.long, device=self.mask.device)
        if self.cache is not None:
            reorder_batch(self.cache, index_t)
        self.mask = self.mask[index_t]

    @torch.no_grad()
    def sample(self, rows: Sequence[int], prompts: Sequence[Sequence[int]], *, max_new_tokens: int,
               temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0,
               stop_strings: Sequence[str] = ("</answer>",), generator: torch.Generator | None = None) -> list[Sample]:
        device, pad = self.model.device, self.texts.pad_id
        new = {}
        for row, prompt in zip(rows, prompts):
            done = self.fed[row]
            if done is None:
                raise ValueError(f"row {row} was released (its episode ended); start a new session to sample it again")
            if list(prompt[: len(done)]) != done:
                raise ValueError(f"row {row}: the prompt does not extend the tokens already fed to the cache")
            new[row] = list(prompt[len(done) :])
            if not new[row]:
                raise ValueError(f"row {row}: nothing new to feed; a prompt must end with at least one new token")
        slots = self.mask.shape[1] + max(len(tokens) for tokens in new.values()) + max_new_tokens  # after this call
        left_out = not set(rows) <= set(self.order)  # a row that sat out a fresh cache's call is not in it
        if self.refeed or (self.window is not None and slots > self.window) or left_out:
            # a fresh cache over these rows only, fed from their first token
            new = {row: list(prompt) for row, prompt in zip(rows, prompts)}
            self.cache, self.order = None, list(rows)
            self.mask = torch.zeros((len(rows), 0), dtype=torch.long, device=device)
            for row in rows:
                self.fed[row] = []
        # batch entries to feed: every live row (a waiting one gets an all-masked hole), or one per distinct
        # prompt when a first call feeds them all; `copies` then maps each row to its prompt's entry
        feeds, copies = [new.get(row, []) for row in self.order], None
        if self.cache is None and len(new) == len(self.order):
            distinct: dict[tuple[int, ...], int] = {}
            index = [distinct.setdefault(tuple(tokens), len(distinct)) for tokens in feeds]
            if len(distinct) < len(feeds):
                feeds, copies = [list(tokens) for tokens in distinct], index
                self.mask = self.mask[: len(feeds)]
        chunk, chunk_mask = left_pad(feeds, pad, device)  # (B, C) each
        logits = self._feed(chunk, chunk_mask)  # (B, V) at each entry's last real token
        if copies is not None:  # copy each distinct prompt's cache to the rows that share it
            self._select(copies)
            logits = logits[torch.tensor(copies, dtype=torch.long, device=logits.device)]
        for row, tokens in new.items():
            self.fed[row].extend(tokens)
        active = torch.tensor([row in new for row in self.order], dtype=torch.bool)
        samples = self._decode(logits, active.to(device), max_new_tokens=max_new_tokens, temperature=temperature,
                               top_p=top_p, top_k=top_k, stop_strings=stop_strings, generator=generator)
        return [samples[row] for row in rows]

    def _feed(self, ids: torch.Tensor, chunk_mask: torch.Tensor) -> torch.Tensor:
        """Run (B, C) new tokens through the model on top of the cache; returns the last position's logits."""
        mask = torch.cat([self.mask, chunk_mask], dim=-1)  # (B, L + C)
        positions = position_ids_from_mask(mask)[:, -ids.shape[1] :]  # (B, C)
        with computing(self.model):
            out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=self.cache,
                             use_cache=True, logits_to_keep=1)
        self.cache, self.mask = out.past_key_values, mask
        return out.logits[:, -1].float()

    def _decode(self, logits: torch.Tensor, running: torch.Tensor, *, max_new_tokens: int, temperature: float,
                top_p: float, top_k: int, stop_strings: Sequence[str], generator: torch.Generator | None
                ) -> dict[int, Sample]:
        """Sample from (B, V) logits for the running batch entries; returns each one's Sample by its row."""
        entries = running.nonzero().flatten().tolist()
        tokens: dict[int, list[int]] = {b: [] for b in entries}
        logprobs: dict[int, list[float]] = {b: [] for b in entries}
        tails = {b: "" for b in entries}
        finish = {b: "length" for b in entries}
        running = running.clone()
        for step in range(max_new_tokens):
            policy_logp = F.log_softmax(logits, dim=-1)  # (B, V) at temperature 1
            if temperature <= 0:
                next_ids = logits.argmax(-1)  # (B,)
            else:
                shaped = filter_logits(logits / temperature, top_k=top_k, top_p=top_p)
                probs = shaped.softmax(-1)  # (B, V)
                if generator is not None and generator.device != probs.device:  # e.g. a CPU generator, CUDA model
                    probs = probs.to(generator.device)
                next_ids = torch.multinomial(probs, 1, generator=generator).squeeze(-1).to(logits.device)  # (B,)
            chosen_logp = policy_logp.gather(-1, next_ids.unsqueeze(-1)).squeeze(-1)  # (B,)
            ids_list, logp_list = next_ids.tolist(), chosen_logp.tolist()
            for b in running.nonzero().flatten().tolist():
                token = ids_list[b]
                tokens[b].append(token)
                logprobs[b].append(logp_list[b])
                if token in self.texts.stop_ids:
                    finish[b], running[b] = "eos", False
                    continue
                tails[b] = (tails[b] + self.texts.text(token))[-STOP_TAIL_CHARS:]
                if any(stop in tails[b] for stop in stop_strings):
                    finish[b], running[b] = "stop", False
            if not running.any() or step + 1 == max_new_tokens:
                break
            # feed the running entries' new tokens; finished ones get a masked hole
            feed = torch.where(running, next_ids, torch.full_like(next_ids, self.texts.pad_id)).unsqueeze(-1)
            logits = self._feed(feed, running.long().unsqueeze(-1))
            for b in running.nonzero().flatten().tolist():
                self.fed[self.order[b]].append(ids_list[b])
        return {self.order[b]: Sample(tuple(tokens[b]), tuple(logprobs[b]), finish[b]) for b in entries}


def reorder_batch(cache: Cache, index: torch.Tensor) -> None:
    """Rebuild a cache's batch from these entries, in place (an entry may repeat). `reorder_cache` reorders every
    layer; a family cache that keeps state beside its layers reorders it in its own `batch_select_indices` only
    (MiniMax's linear-attention states), so that one is used where a cache class defines it."""
    own_select = type(cache).batch_select_indices is not Cache.batch_select_indices
    if own_select and type(cache).reorder_cache is Cache.reorder_cache:
        cache.batch_select_indices(index)
    else:
        cache.reorder_cache(index)


def sample(model: PreTrainedModel, token_texts: TokenTexts, prompts: Sequence[Sequence[int]], *,
           max_new_tokens: int, temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0,
           stop_strings: Sequence[str] = ("</answer>",), generator: torch.Generator | None = None) -> list[Sample]:
    """Sample one continuation per prompt (see the module docstring). temperature 0 is greedy."""
    if not prompts:
        return []
    session = SamplingSession(model, token_texts, len(prompts))
    return session.sample(range(len(prompts)), prompts, max_new_tokens=max_new_tokens, temperature=temperature,
                          top_p=top_p, top_k=top_k, stop_strings=stop_strings, generator=generator)
