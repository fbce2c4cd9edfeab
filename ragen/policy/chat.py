"""One episode as one token sequence, built turn by turn with the model's own chat template.

The sequence is the prompt of every next turn: system + first user message + generation prompt + forced prefix,
then the sampled ids, then the template text that closes the assistant turn and opens the next user and
assistant turns, and so on. Template pieces are found by rendering the conversation with the chat template and
taking the text between the assistant content and the next generation point, so any prefix-stable template
(ChatML / Qwen2.5, Llama 3, ...) works; the sampled ids are never re-tokenised.
"""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase

from ragen.prompting import SYSTEM_PROMPT


class ChatTemplateError(ValueError):
    """The tokenizer's chat template does not render a conversation as a prefix of its continuation."""


class ChatRenderer:
    def __init__(self, tokenizer: PreTrainedTokenizerBase, prefix: str) -> None:
        self.tokenizer = tokenizer
        self.prefix = prefix

    def render(self, messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def start(self, user: str) -> tuple[list[dict[str, str]], list[int], int]:
        """-> messages, the ids to sample the first turn from, and how many of them are the system message.

        The system message is the template's system turn (ChatML, Llama 3), or, where the template folds it into
        the first user turn (Gemma 3's), everything up to the end of its text: `loss_mask: all` trains on what
        follows either way.
        """
        messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]
        text = self.render(messages, add_generation_prompt=True) + self.prefix
        try:
            system = self.render(messages[:1], add_generation_prompt=False)
        except Exception:  # a template that wants a user turn after the system message
            system = ""
        prompt = SYSTEM_PROMPT.strip()  # as a template that trims content writes it
        if prompt in system and text.startswith(system):
            return messages, self.encode(text), len(self.encode(system))
        start = text.find(prompt)
        if start < 0:
            raise ValueError("the chat template drops the system message")
        end = start + len(prompt)
        head = self.encode(text[:end])
        return messages, head + self.encode(text[end:]), len(head)

    def _between(self, messages: list[dict[str, str]], response: str, nxt: dict[str, str] | None) -> str:
        """Template text after the assistant `response` up to the next generation point (or the end).

        A template that trims message content (Llama 3's) drops a response's trailing whitespace, which the
        sampled ids keep; the text returned follows the sampled ids either way.
        """
        content = self.prefix + response
        kept = content.rstrip()
        before = self.render(messages, add_generation_prompt=True) + kept
        closed = messages + [{"role": "assistant", "content": content}]
        if nxt:
            after = self.render(closed + [nxt], add_generation_prompt=True)
        else:
            after = self.render(closed, add_generation_prompt=False)
        if not after.startswith(before):
            raise ChatTemplateError("the chat template does not keep earlier turns unchanged; multi-turn token-in-"
                                    "token-out needs a prefix-stable template")
        rest = after[len(before) :]
        trailing = content[len(kept) :]
        if rest.startswith(trailing):  # the template kept the whitespace: the sampled ids already hold it
            rest = rest[len(trailing) :]
        return rest + (self.prefix if nxt else "")

    def continue_ids(self, messages: list[dict[str, str]], response: str, stop_text: str,
                     user: str | None) -> list[int]:
        """Ids that follow a sampled response: close the turn, then (if `user`) the next user turn and prefix.

        `response` is the decoded sampled text without its end-of-turn token; when the model sampled one itself,
        `stop_text` is that token's text ("" otherwise): it is already in the sequence, so where the template
        closes the turn with the same text it is not added again.
        """
        nxt = {"role": "user", "content": user} if user is not None else None
        text = self._between(messages, response, nxt)
        if stop_text and text.startswith(stop_text):
            text = text[len(stop_text) :]
        return self.encode(text)

    def assistant_message(self, response: str) -> dict[str, str]:
        return {"role": "assistant", "content": self.prefix + response}

    def check(self) -> None:
        """Play a two-turn conversation through the template: ChatTemplateError now rather than mid-rollout."""
        messages, _, _ = self.start("Turn 1:\nState:\n#P_X#")
        response = "I push.</think><answer>Right</answer>"
        self.continue_ids(messages, response, "", "Reward:\n1.0\n\nTurn 2:\nState:\n#_PX#")
        messages += [self.assistant_message(response), {"role": "user", "content": "Turn 2:"}]
        self.continue_ids(messages, response, "", None)
