"""KV-cache sampling: log-probs equal a re-scoring, seeds, stop conditions, the forced prefix, filtering."""

from types import SimpleNamespace

import pytest
import torch
from transformers import PretrainedConfig

from ragen.policy.sampling import TokenTexts, filter_logits, left_pad, sample
from ragen.policy.scoring import score_sequences


def prompts_of(policy, texts):
    return [policy.tokenizer.encode(t, add_special_tokens=False) for t in texts]


@pytest.mark.parametrize("settings", [dict(temperature=1.0), dict(temperature=0.7, top_p=0.9), dict(temperature=1.3, top_k=20)])
def test_sampled_logprobs_equal_rescoring(any_policy, generator, settings):
    policy = any_policy
    prompts = prompts_of(policy, ["State:\n#_P#", "You have 3 actions left. Always output:", "Target: 5, nums: [1, 2, 3]", "Up"])
    samples = policy.sample(prompts, max_new_tokens=24, generator=generator, **settings)
    sequences = [list(p) + list(s.token_ids) for p, s in zip(prompts, samples)]
    ids, mask = left_pad(sequences, policy.tokenizer.pad_token_id, policy.model.device)
    logprobs, entropy = score_sequences(policy.model, ids, mask)
    for row, s in enumerate(samples):
        rescored = logprobs[row, ids.shape[1] - len(s.token_ids):]
        assert torch.allclose(rescored, torch.tensor(s.logprobs), atol=1e-4)
        assert (entropy[row, ids.shape[1] - len(s.token_ids):] > 0).all()


def test_same_seed_same_samples_other_seed_other_samples(policy):
    prompts = prompts_of(policy, ["State:", "Turn 2:"] * 4)
    a = policy.sample(prompts, max_new_tokens=16, generator=torch.Generator().manual_seed(7))
    b = policy.sample(prompts, max_new_tokens=16, generator=torch.Generator().manual_seed(7))
    c = policy.sample(prompts, max_new_tokens=16, generator=torch.Generator().manual_seed(8))
    assert a == b and a != c


def test_greedy_is_argmax(policy):
    prompts = prompts_of(policy, ["State:\n"])
    greedy = policy.sample(prompts, max_new_tokens=5, temperature=0.0)[0]
    ids = list(prompts[0])
    for token in greedy.token_ids:
        logits = policy.model(input_ids=torch.tensor([ids])).logits[0, -1]
        assert token == int(logits.argmax())
        ids.append(token)


class ScriptedLM(torch.nn.Module):
    """A stand-in LM that emits a fixed token script (row r emits scripts[r][k] at its k-th new token)."""

    def __init__(self, scripts, vocab, prompt_len):
        super().__init__()
        self.scripts, self.vocab, self.prompt_len = scripts, vocab, prompt_len
        self.config = PretrainedConfig(num_hidden_layers=1)  # no layer types: one attention layer, no window
        self.anchor = torch.nn.Parameter(torch.zeros(1))

    @property
    def device(self):
        return self.anchor.device

    def forward(self, input_ids, attention_mask, position_ids, use_cache=True, past_key_values=None, logits_to_keep=0):
        step = attention_mask.shape[1] - self.prompt_len  # tokens generated so far
        logits = torch.full((input_ids.shape[0], 1, self.vocab), -30.0)
        for row, script in enumerate(self.scripts):
            logits[row, 0, script[min(step, len(script) - 1)]] = 30.0
        return SimpleNamespace(logits=logits, past_key_values=None)


def test_stop_at_answer_close_end_of_turn_and_length(tokenizer):
    enc = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    stop_script = enc("go.</think><answer>Up</answer>") + enc(" more text")
    eos_script = enc("go") + [tokenizer.convert_tokens_to_ids("<|im_end|>")] + enc("never")
    long_script = enc("a b c d e f g h i j k l m n o p")
    model = ScriptedLM([stop_script, eos_script, long_script], len(tokenizer), prompt_len=2)
    samples = sample(model, TokenTexts(tokenizer), [[5, 6], [7, 8], [9, 10]], max_new_tokens=6)
    assert samples[0].finish == "stop" and tokenizer.decode(samples[0].token_ids).endswith("</answer>")
    assert samples[1].finish == "eos" and samples[1].token_ids[-1] == tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert samples[2].finish == "length" and len(samples[2].token_ids) == 6


def test_an_output_row_past_the_tokenizer_samples_as_empty_text(tokenizer):
    """Checkpoints pad their output rows (Qwen2.5-0.5B-Instruct: 151,936 for 151,665 tokens) and a sampler draws
    from every row: such an id is kept (its log-prob is the model's), reads as no text, as the tokenizer decodes
    it, and a stop string around it still stops the turn."""
    enc = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    padded = len(tokenizer) + 100
    script = enc("go.</think><answer>Up</") + [padded] + enc("answer>") + enc(" more text")
    model = ScriptedLM([script], len(tokenizer) + 256, prompt_len=2)
    (sampled,) = sample(model, TokenTexts(tokenizer), [[5, 6]], max_new_tokens=40)
    assert padded in sampled.token_ids and sampled.finish == "stop"
    assert tokenizer.decode(sampled.token_ids) == "go.</think><answer>Up</answer>"


def test_the_models_own_end_tokens_stop_it(tokenizer):
    """A Llama 3 style checkpoint: the tokenizer's eos is <|end_of_text|>, the model ends turns with <|eot_id|>,
    which its generation config lists; the Policy reads that list."""
    from transformers import GenerationConfig

    from chat_templates import llama3_style
    from ragen.policy import Policy

    tok = llama3_style(tokenizer)
    eot, end = tok.convert_tokens_to_ids("<|eot_id|>"), tok.convert_tokens_to_ids("<|end_of_text|>")
    script = tok.encode("go", add_special_tokens=False) + [eot] + tok.encode("never", add_special_tokens=False)
    model = ScriptedLM([script], len(tok), prompt_len=2)
    assert sample(model, TokenTexts(tok), [[5, 6]], max_new_tokens=6)[0].finish == "length"
    model.generation_config = GenerationConfig(eos_token_id=[end, eot])
    policy = Policy(model, tok)
    assert {end, eot} <= policy.token_texts.stop_ids
    stopped = policy.sample([[5, 6]], max_new_tokens=6)[0]
    assert stopped.finish == "eos" and stopped.token_ids[-1] == eot
    model.generation_config = GenerationConfig(eos_token_id=eot)  # one id, not a list
    assert eot in Policy(model, tok).token_texts.stop_ids


def test_forced_prefix_opens_generation(policy):
    for think, prefix in ((True, "<think>"), (False, "<answer>")):
        _, ids, _ = policy.renderer(think).start("Turn 1:\nState:\nPG\n")
        assert policy.tokenizer.decode(ids).endswith("<|im_start|>assistant\n" + prefix)


def test_filter_logits_by_hand():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = lambda x: torch.isfinite(x)[0].tolist()  # noqa: E731
    assert kept(filter_logits(logits, top_k=2, top_p=1.0)) == [True, True, False, False]
    # top-p 0.7: 0.5 < 0.7 so 0.3 is needed too (0.8 >= 0.7); 0.15 is not
    assert kept(filter_logits(logits, top_k=0, top_p=0.7)) == [True, True, False, False]
    assert kept(filter_logits(logits, top_k=0, top_p=0.5)) == [True, False, False, False]
    assert kept(filter_logits(logits, top_k=0, top_p=1.0)) == [True] * 4


def test_session_turns_equal_fresh_passes(any_policy):
    """Feeding only each turn's new tokens on top of the kept cache gives the same samples and log-probs as
    sampling every turn from scratch: greedy continuations and re-scored log-probs agree. With recurrent layers,
    where a waiting row's or a shorter suffix's masked positions would move the state, too."""
    from ragen.policy.sampling import SamplingSession

    policy = any_policy
    enc = lambda text: policy.tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    prompts = [enc("State:\n#_P#\n"), enc("Turn 1:\nState:\nPG\nYou have 3 actions left."), enc("Up")]
    session = SamplingSession(policy.model, policy.token_texts, 3)
    sequences = [list(p) for p in prompts]
    for turn in range(3):
        rows = [0, 1, 2] if turn != 1 else [0, 2]  # row 1 sits out turn 2
        got = session.sample(rows, [sequences[r] for r in rows], max_new_tokens=6, temperature=0.0)
        fresh = policy.sample([sequences[r] for r in rows], max_new_tokens=6, temperature=0.0)
        for row, a, b in zip(rows, got, fresh):
            assert a.token_ids == b.token_ids
            assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)
            sequences[row] += list(a.token_ids) + enc(f"\nReward:\n0.{turn}\nTurn {turn + 2}:\n")
    with pytest.raises(ValueError, match="does not extend"):
        session.sample([0], [enc("something else entirely")], max_new_tokens=2)


def test_session_shares_a_prompt_once_and_drops_released_rows(any_policy):
    """Rows that start from one prompt are prefilled once and copied; released rows leave the batch; both give
    the samples and log-probs of fresh passes, and a released row cannot be sampled again."""
    from ragen.policy.sampling import SamplingSession

    policy = any_policy
    enc = lambda text: policy.tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    shared, other = enc("State:\n#_P#\n"), enc("Turn 1:\nState:\nPG\n")
    sequences = [list(shared), list(shared), list(other), list(shared)]
    batches = []
    forward = policy.model.forward

    def counting(*args, **kwargs):
        batches.append(kwargs["input_ids"].shape[0])
        return forward(*args, **kwargs)

    policy.model.forward = counting
    try:
        session = SamplingSession(policy.model, policy.token_texts, 4)
        for turn, rows in enumerate(([0, 1, 2, 3], [0, 1, 3], [1, 3])):
            session.release(sorted({0, 1, 2, 3} - set(rows)))
            batches.clear()
            got = session.sample(rows, [sequences[r] for r in rows], max_new_tokens=6, temperature=0.0)
            assert batches[0] == (2 if turn == 0 else len(rows))  # two distinct prompts; then the live rows only
            fresh = policy.sample([sequences[r] for r in rows], max_new_tokens=6, temperature=0.0)
            for row, a, b in zip(rows, got, fresh):
                assert a.token_ids == b.token_ids
                assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)
                sequences[row] += list(a.token_ids) + enc(f"\nReward:\n0.{row}\nTurn {turn + 2}:\n")  # rows diverge
    finally:
        policy.model.forward = forward
    with pytest.raises(ValueError, match="released"):
        session.sample([2], [sequences[2] + enc("Up")], max_new_tokens=2)


def test_a_row_that_sat_out_a_fresh_cache_comes_back_whole(any_policy, windowed_policy):
    """A call that starts a fresh cache (recurrent layers always; a window once the cache could outgrow it) holds
    only the rows it samples: a row that sat it out is fed whole when it comes back, even by a call that would
    otherwise keep the cache. The windowed case: row 2's long prompt leaves holes in rows 0 and 1, so their call
    outgrows the 24-slot window and refeeds them alone, and row 2's next call fits the window again."""
    from ragen.policy.sampling import SamplingSession

    policy = any_policy
    session = SamplingSession(policy.model, policy.token_texts, 3)
    sequences = [[5, 6], [7, 8], list(range(20, 32))]
    for rows, max_new_tokens in (([0, 1, 2], 2), ([0, 1], 10), ([2], 2), ([0, 2], 2), ([0, 2], 8)):
        got = session.sample(rows, [sequences[r] for r in rows], max_new_tokens=max_new_tokens, temperature=0.0)
        fresh = policy.sample([sequences[r] for r in rows], max_new_tokens=max_new_tokens, temperature=0.0)
        for row, a, b in zip(rows, got, fresh):
            assert a.token_ids == b.token_ids
            assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)
            sequences[row] += list(a.token_ids) + [40 + row]
    if policy is windowed_policy:
        assert session.order == [0, 2] and session.mask.shape[1] >= session.window
        session.release([0])  # past the window every later call refeeds: the cache is dropped, not reordered
        assert session.cache is None and session.order == [2]


def test_a_tokenizer_without_chatml_stops_at_its_own_end_tokens_only():
    """`<|im_end|>` is a stop token only where the vocabulary has it: a tokenizer with an unknown token maps any
    missing token to <unk>, which must not become a stop."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "</s>": 1, "<pad>": 2, "Up": 3, "Down": 4}
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="<unk>")), unk_token="<unk>",
                                  eos_token="</s>", pad_token="<pad>")
    assert tok.convert_tokens_to_ids("<|im_end|>") == 0
    assert TokenTexts(tok).stop_ids == {1, 2} and TokenTexts(tok, [4]).stop_ids == {1, 2, 4}
