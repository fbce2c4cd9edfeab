"""Chat templates of other model families, on our small tokenizer, for the real-checkpoint code paths.

`llama3_style` gives a tokenizer that behaves like a Llama 3 Instruct checkpoint's: a begin-of-text token,
role headers, content trimmed of surrounding whitespace, turns closed by <|eot_id|>, and (as in the first Llama 3
release) a tokenizer eos of <|end_of_text|> that is not the token closing a turn. THINK_STRIPPING (ChatML) and
LLAMA3_THINK_STRIPPING rewrite earlier assistant turns (drop their reasoning, as Qwen3's template does), so a
conversation is not a prefix of its continuation. GEMMA3_STYLE folds the system message into the first user turn.
"""

import copy

LLAMA3_STYLE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim"
    " + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)

# Llama 3's template, but dropping the reasoning of earlier assistant turns (Qwen3's habit)
LLAMA3_THINK_STRIPPING = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{%- set content = message['content'] %}"
    "{%- if message['role'] == 'assistant' and not loop.last and '</think>' in content %}"
    "{%- set content = content.split('</think>')[-1] %}"
    "{%- endif %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + content | trim + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)

# Gemma 3's way with a system message: no system turn; its text opens the first user turn
GEMMA3_STYLE = (
    "{{- bos_token }}"
    "{%- if messages[0]['role'] == 'system' %}{%- set first = messages[0]['content'] + '\\n\\n' %}"
    "{%- set rest = messages[1:] %}{%- else %}{%- set first = '' %}{%- set rest = messages %}{%- endif %}"
    "{%- for m in rest %}"
    "{{- '<start_of_turn>' + ('model' if m['role'] == 'assistant' else m['role']) + '\\n'"
    " + (first if loop.first else '') + m['content'] | trim + '<end_of_turn>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<start_of_turn>model\\n' }}{%- endif %}"
)

THINK_STRIPPING = (
    "{%- for message in messages %}"
    "{%- set content = message['content'] %}"
    "{%- if message['role'] == 'assistant' and not loop.last and '</think>' in content %}"
    "{%- set content = content.split('</think>')[-1] %}"
    "{%- endif %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + content + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def llama3_style(tokenizer, template=LLAMA3_STYLE):
    """A copy of `tokenizer` with Llama 3's special tokens and a template that works as Llama 3's does."""
    tok = copy.deepcopy(tokenizer)
    tok.add_special_tokens({"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>",
                            "additional_special_tokens": ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]})
    tok.chat_template = template
    return tok


def gemma3_style(tokenizer):
    """A copy of `tokenizer` with Gemma's turn tokens and GEMMA3_STYLE."""
    tok = copy.deepcopy(tokenizer)
    tok.add_special_tokens({"bos_token": "<bos>", "additional_special_tokens": ["<start_of_turn>", "<end_of_turn>"]})
    tok.chat_template = GEMMA3_STYLE
    return tok


def llama3_text(messages, add_generation_prompt=False, untrimmed="assistant"):
    """What a Llama 3 sequence of `messages` reads, by hand; `untrimmed` messages keep their whitespace (the
    sampled ids of a response keep theirs)."""
    text = "<|begin_of_text|>"
    for m in messages:
        content = m["content"] if m["role"] == untrimmed else m["content"].strip()
        text += f"<|start_header_id|>{m['role']}<|end_header_id|>\n\n{content}<|eot_id|>"
    return text + ("<|start_header_id|>assistant<|end_header_id|>\n\n" if add_generation_prompt else "")
