"""The embedded tokenizer: byte-level round trips, ChatML specials, the chat template."""

import pytest

from ragen.envs import make_env
from ragen.prompting import first_user_message


@pytest.mark.parametrize("tag", ["sokoban", "sokoban_vocab", "frozen_lake", "bandit_test", "countdown"])
def test_round_trip_on_env_text(tokenizer, tag):
    env = make_env(tag)
    state, _ = env.reset(seed=99)
    text = first_user_message(env, state, env.max_actions_per_traj, True)
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text


@pytest.mark.parametrize("text", ["Zebra quokka xylophone", "ünïcödé 日本語 🚀", "  spaces\tand\ttabs  ", "\x00\x01", "Up||Down"])
def test_round_trip_on_words_never_seen(tokenizer, text):
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text
    assert tokenizer.unk_token_id is None or tokenizer.unk_token_id not in ids


def test_chatml_special_tokens_are_single_ids(tokenizer):
    for special in ("<|im_start|>", "<|im_end|>", "<|endoftext|>"):
        assert len(tokenizer.encode(special, add_special_tokens=False)) == 1
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    assert tokenizer.padding_side == "left"


def test_chat_template_renders_a_multi_turn_conversation(tokenizer):
    messages = [
        {"role": "system", "content": "You're a helpful assistant. "},
        {"role": "user", "content": "Turn 1"},
        {"role": "assistant", "content": "<think>a</think><answer>Up</answer>"},
        {"role": "user", "content": "Reward:\n-0.1\n\nTurn 2"},
    ]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nYou're a helpful assistant. <|im_end|>\n"
        "<|im_start|>user\nTurn 1<|im_end|>\n"
        "<|im_start|>assistant\n<think>a</think><answer>Up</answer><|im_end|>\n"
        "<|im_start|>user\nReward:\n-0.1\n\nTurn 2<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_countdown_operators_are_whole_tokens_and_survive_saving(tokenizer, tmp_path):
    from transformers import PreTrainedTokenizerFast

    text = "<answer>(89 * 61) / 34 - 2 + 5</answer>"
    ids = tokenizer.encode(text, add_special_tokens=False)
    pieces = [tokenizer.decode([i]) for i in ids]
    assert {" * ", " / ", " - ", " + "} <= set(pieces) and tokenizer.decode(ids) == text
    tokenizer.save_pretrained(tmp_path)
    assert PreTrainedTokenizerFast.from_pretrained(tmp_path).encode(text, add_special_tokens=False) == ids
