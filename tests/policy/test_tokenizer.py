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


GRID_TAGS = ["sokoban", "sokoban_vocab", "sokoban_large", "frozen_lake"]


@pytest.fixture(scope="module")
def cells_tokenizer():
    from ragen.policy.tokenizer import env_corpus, train_tokenizer

    return train_tokenizer(env_corpus([*GRID_TAGS, "countdown"], episodes_per_env=8, seed=0), vocab_size=512,
                           grid_tokens="cells")


@pytest.mark.parametrize("tag", GRID_TAGS)
def test_grid_cells_give_one_token_per_cell_and_leave_prose_alone(cells_tokenizer, tag):
    env = make_env(tag)
    state, _ = env.reset(seed=99)
    rows = state.split("\n")
    ids = cells_tokenizer.encode(state, add_special_tokens=False)
    # every cell and every newline its own token: the cell below another is always width + 1 tokens further on
    assert [cells_tokenizer.decode([i]) for i in ids] == [c for c in "\n".join(rows)]
    assert len(ids) == sum(len(row) for row in rows) + len(rows) - 1
    text = first_user_message(env, state, env.max_actions_per_traj, True)
    assert cells_tokenizer.decode(cells_tokenizer.encode(text, add_special_tokens=False)) == text
    # the lines around the grid, and responses, are merged as before
    for line in ("State:", "Turn 1:", "<think>I will move Up.</think><answer>Up || Left</answer>"):
        assert len(cells_tokenizer.encode(line, add_special_tokens=False)) < len(line) / 2, line


def test_grid_cells_split_a_line_whole_or_not_at_all():
    from tokenizers import pre_tokenizers

    from ragen.policy.tokenizer import GRID_CELLS, LINES_AND_DIGITS, SENTENCE_ENDS

    split = pre_tokenizers.Sequence([LINES_AND_DIGITS, GRID_CELLS, SENTENCE_ENDS])

    def pieces(text):
        return [piece for piece, _ in split.pre_tokenize_str(text)]

    assert pieces("State:\n#OPX_#\nWGAB.W\n√S@.") == [
        "State:", "\n", "#", "O", "P", "X", "_", "#", "\n", "W", "G", "A", "B", ".", "W", "\n", "√", "S", "@", "."]
    # a line with a lowercase letter, a digit, a colon or whitespace is prose: not even its trailing grid-like
    # characters are cut off one by one
    assert pieces("Reward:\n-0.1") == ["Reward:", "\n", "-", "0", ".", "1"]
    assert pieces("#_# x") == ["#_# x"]
    assert pieces("XO, P") == ["XO,", " P"]
    assert pieces("left (tokens).") == ["left (tokens)."]
    assert pieces("<answer>Up || Left</answer>") == ["<answer>Up || Left</answer>"]


def test_grid_tokens_must_be_bpe_or_cells():
    from ragen.policy.tokenizer import train_tokenizer

    with pytest.raises(ValueError, match="grid_tokens: 'cell' is not one of bpe, cells"):
        train_tokenizer(["#_#"], 300, grid_tokens="cell")
