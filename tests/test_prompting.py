"""RAGEN's prompt strings and the response parser."""

import time

import pytest

from ragen.envs import make_env
from ragen.prompting import first_user_message, next_user_message, parse_response, reward_text


def test_first_sokoban_message_is_ragens_text():
    env = make_env("sokoban")
    state, _ = env.reset(options={"layout": "######\n#_P__#\n#_X__#\n#_O__#\n######"})
    expected = (
        "You are solving the Sokoban puzzle. You are the player and you need to push all boxes to targets. When you "
        "are right next to a box, you can push it by moving in the same direction. You cannot push a box through a "
        "wall, and you cannot pull a box. The answer should be a sequence of actions, like <answer>Right || Right || "
        "Up</answer>\nThe meaning of each symbol in the state is:\n#: wall, _: empty, O: target, √: box on target, "
        "X: box, P: player, S: player on target\nYour available actions are:\nUp, Down, Left, Right\nYou can make up "
        "to 10 actions, separated by the action separator \" || \"\n\nTurn 1:\nState:\n######\n#_P__#\n#_X__#\n"
        "#_O__#\n######\nYou have 10 actions left. Always output: <think> [Your thoughts] </think> <answer> [your "
        "answer] </answer> with no extra text. Strictly follow this format. Max response length: 100 words (tokens).\n"
    )
    assert first_user_message(env, state, 10, enable_think=True) == expected


def test_bandit_and_countdown_list_no_actions():
    for tag in ("bandit", "countdown"):
        env = make_env(tag)
        state, _ = env.reset(seed=0)
        text = first_user_message(env, state, 1, enable_think=False)
        assert "Your available actions" not in text and "meaning of each symbol" not in text
        assert "Always output: <answer> [your answer] </answer> with no extra text." in text


def test_reward_message_shows_python_float_and_next_turn():
    assert reward_text(-0.1 * 3) == "Reward:\n-0.30000000000000004\n"
    text = next_user_message(0.9, 2, "PG", 8, enable_think=True)
    assert text.startswith("Reward:\n0.9\n\nTurn 2:\nState:\nPG\nYou have 8 actions left.")


def test_sokoban_vocab_legend_uses_its_own_symbols():
    env = make_env("sokoban_vocab")
    state, _ = env.reset(seed=0)
    assert "W: wall, .: empty, G: target, C: box on target, B: box, A: player, @: player on target" in first_user_message(env, state, 10, True)


# --- parsing ---
def test_parse_think_and_actions():
    parsed = parse_response("<think> push it right </think>\n<answer> Right || Up|| ||Left </answer>", max_actions=5)
    assert parsed.format_ok and parsed.think == "push it right"
    assert parsed.actions == ("Right", "Up", "Left") and parsed.answer == "Right || Up|| ||Left"


def test_actions_beyond_max_are_dropped():
    assert parse_response("<think>x</think><answer>Up || Down || Left</answer>", max_actions=2).actions == ("Up", "Down")


def test_end_of_turn_tokens_are_ignored():
    assert parse_response("<think>a</think><answer>Up</answer><|im_end|>", max_actions=5).format_ok


def test_no_think_mode():
    assert parse_response("<answer>Dragon</answer>", max_actions=1, enable_think=False).actions == ("Dragon",)
    assert not parse_response("<think>a</think><answer>Dragon</answer>", max_actions=1, enable_think=False).format_ok


@pytest.mark.parametrize(
    "text",
    [
        "Up",  # no tags
        "<think>a</think>",  # no answer
        "<think>a</think><answer></answer>",  # empty answer
        "<think>a</think><answer> || </answer>",  # only separators
        "<think>a<think>b</think><answer>Up</answer>",  # nested think
        "<think>a</think><answer>Up<answer>Down</answer>",  # nested answer
        "<think>a</think><answer>Up</answer><answer>Down</answer>",  # repeated answer
        "<think>a</think><think>b</think><answer>Up</answer>",  # repeated think
        "<think>a</think><answer>Up</answer> and more text",  # text after the answer
        "<answer>Up</answer>",  # think mode needs the think block
        "<think>a</think><answer>Up",  # unclosed
        "\x00\ufffd\u202e<think>\udcff</think>",  # unicode garbage
        "",
        None,
        12,
    ],
)
def test_malformed_responses_are_not_format_ok(text):
    parsed = parse_response(text, max_actions=5)
    assert not parsed.format_ok and parsed.actions == ()


def test_huge_responses_are_rejected_in_milliseconds():
    for text in ["<think>" + "x" * 100_000, "<think>" + "</think>" * 13_000, "<think>a</think><answer>" + "Up||" * 25_000,
                 "<think>" + "<answer>" * 12_000 + "</think><answer>Up</answer>"]:
        start = time.perf_counter()
        parsed = parse_response(text, max_actions=5)
        assert time.perf_counter() - start < 0.05
    assert parsed.format_ok is False
