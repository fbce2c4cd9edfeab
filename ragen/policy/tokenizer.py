"""The embedded default's tokenizer: byte-level BPE trained on the text the environments produce.

Byte-level means every byte is in the base alphabet, so any string (unseen words, unicode) round-trips. The
special tokens and chat template are ChatML's, as in Qwen2.5: <|im_start|>role\\ncontent<|im_end|>\\n.
"""

from __future__ import annotations

import random
from typing import Iterator, Sequence

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from ragen.envs import make_env
from ragen.prompting import SYSTEM_PROMPT, first_user_message, next_user_message

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [PAD_TOKEN, IM_START, IM_END]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# Pieces BPE may not merge across: newlines and single digits (numbers stay compositional for Countdown and
# rewards), and sentence ends (a space after . , : ? starts a new piece). Inside a piece merges may cross spaces,
# so the constant prompt sentences and common grid rows become single tokens: env text averages ~6 characters
# per token instead of ~3.5 with GPT-2's word regex, which is what CPU training pays for.
LINES_AND_DIGITS = pre_tokenizers.Split(Regex(r"\n|\d"), behavior="isolated")
SENTENCE_ENDS = pre_tokenizers.Split(Regex(r"(?<=[.,:?]) "), behavior="merged_with_next")
BYTES = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
PRE_TOKENIZER = pre_tokenizers.Sequence([LINES_AND_DIGITS, SENTENCE_ENDS, BYTES])
# Grid rows one cell a token (`model.grid_tokens: cells`). A grid row is a whole line with no lowercase letter,
# digit, colon or whitespace ("#OPX_#", "WGAB.W", "_O__"); "State:" or a response is not. The pattern runs on each
# line (the split above isolates newlines) and matches one character at a time from the line's start (\G), each
# only where the rest of the line is grid characters too, so a line is split into cells whole or not at all.
GRID_CELLS = pre_tokenizers.Split(Regex(r"\G[^a-z\s\d:](?=[^a-z\s\d:]*$)"), behavior="isolated")
PRE_TOKENIZER_CELLS = pre_tokenizers.Sequence([LINES_AND_DIGITS, GRID_CELLS, SENTENCE_ENDS, BYTES])
# Countdown's operators with their spaces, one token each whatever BPE learned: BPE merged " + " and " - " but
# left " * " and " / " as three tokens, whose bare " " is also what precedes a number in the prompt's list
# ("nums: [35, 12]"), and the warm-started model then often wrote two numbers with no operator between them
OPERATOR_TOKENS = [" + ", " - ", " * ", " / "]
# Short, skill-free thoughts per kind of action. Each kind has its own phrases (so one env's phrasing never
# leads into another env's actions), and a thought names the actions exactly as the answer spells them.
THOUGHTS = {
    "move": ("I will move {a}.", "Let me try {a} first.", "The player should go {a}.", "Moving {a} looks fine."),
    "arm": ("I choose {a}.", "I will pull {a}.", "{a} sounds better."),
    "expression": ("I combine the numbers in order.", "Let me try one equation.", "I use every number once."),
}


def thought_kind(env) -> str:
    if env.action_names is None:
        return "expression"
    return "arm" if env.max_actions_per_traj == 1 else "move"


def example_response(rng: random.Random, actions: Sequence[str], enable_think: bool = True, *, kind: str = "move") -> str:
    """A well-formed response with a short, skill-free thought (of `kind`): the warm-start format."""
    answer = " || ".join(actions)
    if not enable_think:
        return f"<answer>{answer}</answer>"
    thought = rng.choice(THOUGHTS[kind]).format(a=" then ".join(actions))
    return f"<think>{thought}</think><answer>{answer}</answer>"


def random_action(env, rng: random.Random) -> str:
    """A valid action drawn at random: a name, or for Countdown its numbers in order with random operators."""
    if env.action_names:
        return rng.choice(env.action_names)
    text = str(env.nums[0])
    for n in env.nums[1:]:
        text += f" {rng.choice('+-*/')} {n}"
    return text


def env_corpus(tags: Sequence[str], episodes_per_env: int = 64, seed: int = 0) -> Iterator[str]:
    """Conversations played with random valid actions: every string a prompt or response can contain."""
    rng = random.Random(seed)
    yield SYSTEM_PROMPT
    for tag in tags:
        env = make_env(tag)
        for episode in range(episodes_per_env):
            for enable_think in (True, False):
                state, _ = env.reset(seed=rng.randrange(2**31))
                left = env.max_actions_per_traj
                yield first_user_message(env, state, left, enable_think)
                for turn in range(2, env.max_turns + 2):
                    actions = [random_action(env, rng) for _ in range(rng.randint(1, min(3, left)))]
                    yield example_response(rng, actions, enable_think, kind=thought_kind(env))
                    reward, done = 0.0, False
                    for action in actions:
                        state, r, terminated, truncated, _ = env.step(action)
                        reward, left, done = reward + r, left - 1, terminated or truncated
                        if done or left == 0:
                            break
                    if done or left == 0 or turn > env.max_turns:
                        yield f"Reward:\n{reward}\n"
                        break
                    yield next_user_message(reward, turn, state, left, enable_think)


def train_tokenizer(texts: Iterator[str] | Sequence[str], vocab_size: int, *, grid_tokens: str = "bpe"
                    ) -> PreTrainedTokenizerFast:
    """Byte-level BPE with ChatML special tokens, chat template and whole operator tokens, as a transformers
    tokenizer. grid_tokens "cells" keeps each cell of a grid row its own token (see GRID_CELLS)."""
    if grid_tokens not in ("bpe", "cells"):
        raise ValueError(f"grid_tokens: {grid_tokens!r} is not one of bpe, cells")
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = PRE_TOKENIZER_CELLS if grid_tokens == "cells" else PRE_TOKENIZER
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    core.train_from_iterator(texts, trainer=trainer)
    core.add_tokens([AddedToken(op, normalized=False) for op in OPERATOR_TOKENS])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, eos_token=IM_END, pad_token=PAD_TOKEN, clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.padding_side = "left"
    return tokenizer
