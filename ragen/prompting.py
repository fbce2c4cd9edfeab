"""RAGEN's prompts and response format: render a multi-turn episode as chat messages, parse a response.

Messages (ragen-reference section 3.2):
    system:    "You're a helpful assistant. "
    user:      instruction [+ symbol legend] [+ action list and budget] + "\\nTurn 1:\\nState:\\n{state}\\nYou have
               {n} actions left. Always output: <think> [Your thoughts] </think> <answer> [your answer] </answer>
               with no extra text. Strictly follow this format. Max response length: {max_tokens} words (tokens).\\n"
    assistant: "<think>...</think><answer>a1 || a2</answer>"
    user:      "Reward:\\n{r}\\n" + "\\nTurn 2:\\n..."   (the next turn's text joins the reward message)
Generation starts after a forced "<think>" ("<answer>" in no-think mode), which is part of the prompt.
"""

from __future__ import annotations

from dataclasses import dataclass

from ragen.envs.base import TextEnv

SYSTEM_PROMPT = "You're a helpful assistant. "
ACTION_SEP = "||"
THINK_FORMAT = "<think> [Your thoughts] </think> <answer> [your answer] </answer>"
NO_THINK_FORMAT = "<answer> [your answer] </answer>"
TAGS = ("<think>", "</think>", "<answer>", "</answer>")
SPECIAL_STRINGS = ("<|im_start|>", "<|im_end|>", "<|endoftext|>")
MAX_TOKENS_HINT = 100  # RAGEN's custom_envs.<tag>.max_tokens: a hint in the prompt, not a limit


def forced_prefix(enable_think: bool) -> str:
    """The text generation is forced to start with."""
    return "<think>" if enable_think else "<answer>"


def instruction_text(env: TextEnv) -> str:
    """The env instruction with RAGEN's legend and action list appended where the env has them."""
    text = env.instruction
    if env.grid_vocab:
        text += "\nThe meaning of each symbol in the state is:\n" + ", ".join(f"{k}: {v}" for k, v in env.grid_vocab.items())
    if env.lists_actions and env.action_names:
        text += (
            "\nYour available actions are:\n" + ", ".join(env.action_names)
            + f"\nYou can make up to {env.max_actions_per_traj} actions, separated by the action separator \" || \"\n"
        )
    return text


def turn_text(turn: int, state: str, actions_left: int, enable_think: bool, max_tokens: int = MAX_TOKENS_HINT) -> str:
    fmt = THINK_FORMAT if enable_think else NO_THINK_FORMAT
    return (
        f"\nTurn {turn}:\nState:\n{state}\nYou have {actions_left} actions left. Always output: {fmt} with no extra "
        f"text. Strictly follow this format. Max response length: {max_tokens} words (tokens).\n"
    )


def reward_text(reward: float) -> str:
    """RAGEN shows the turn reward as Python's str of the float (so -0.30000000000000004 can appear)."""
    return f"Reward:\n{float(reward)}\n"


def first_user_message(env: TextEnv, state: str, actions_left: int, enable_think: bool) -> str:
    return instruction_text(env) + turn_text(1, state, actions_left, enable_think)


def next_user_message(reward: float, turn: int, state: str, actions_left: int, enable_think: bool) -> str:
    return reward_text(reward) + turn_text(turn, state, actions_left, enable_think)


@dataclass(frozen=True)
class ParsedResponse:
    """A response split into its parts. `format_ok` is False whenever `actions` could not be read."""

    think: str
    answer: str
    actions: tuple[str, ...]
    format_ok: bool


NOT_PARSED = ParsedResponse(think="", answer="", actions=(), format_ok=False)


def _clean(text: str) -> str:
    for special in SPECIAL_STRINGS:
        text = text.replace(special, "")
    return text.strip()


def parse_response(text: str, max_actions: int, enable_think: bool = True) -> ParsedResponse:
    """Read "<think>T</think><answer>a1 || a2</answer>" (no-think: "<answer>a1</answer>").

    `text` is the whole response including the forced prefix. It must be exactly one think block (think mode)
    followed by exactly one answer block, with only whitespace or end-of-turn tokens around them; tags nested
    or repeated, text after the answer, or an empty answer give `format_ok=False`. Actions are split on "||",
    stripped, empty ones dropped, and the first `max_actions` kept. Linear time: no regex backtracking, so
    100 KB of garbage is rejected in milliseconds. Never raises on a string.
    """
    if not isinstance(text, str):
        return NOT_PARSED
    rest = _clean(text)
    think = ""
    if enable_think:
        if not rest.startswith("<think>"):
            return NOT_PARSED
        end = rest.find("</think>")
        if end < 0:
            return NOT_PARSED
        think, rest = rest[len("<think>") : end], rest[end + len("</think>") :].lstrip()
    if not rest.startswith("<answer>"):
        return NOT_PARSED
    end = rest.find("</answer>")
    if end < 0 or rest[end + len("</answer>") :].strip():
        return NOT_PARSED
    answer = rest[len("<answer>") : end]
    if any(tag in think or tag in answer for tag in TAGS):
        return NOT_PARSED
    actions = tuple(a.strip() for a in answer.split(ACTION_SEP) if a.strip())[:max_actions]
    if not actions:
        return NOT_PARSED
    return ParsedResponse(think=think.strip(), answer=answer.strip(), actions=actions, format_ok=True)
