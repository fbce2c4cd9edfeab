"""A random tiny Qwen3.5 for tests (no download): a linear-attention (Gated DeltaNet) layer, whose state moves at
every position fed, then an attention layer; weights large enough that a masked hole would show."""

from pathlib import Path

import torch
from transformers import (PreTrainedTokenizerBase, Qwen3_5Config, Qwen3_5ForCausalLM, Qwen3_5ForConditionalGeneration,
                          Qwen3_5TextConfig)


def text_config(tokenizer: PreTrainedTokenizerBase) -> dict:
    return dict(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                layer_types=["linear_attention", "full_attention"], num_attention_heads=2, num_key_value_heads=1,
                head_dim=16, linear_key_head_dim=8, linear_value_head_dim=8, linear_num_key_heads=2,
                linear_num_value_heads=2, max_position_embeddings=2048, eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id, initializer_range=0.2)


def text_model(tokenizer: PreTrainedTokenizerBase) -> Qwen3_5ForCausalLM:
    torch.manual_seed(0)
    return Qwen3_5ForCausalLM(Qwen3_5TextConfig(**text_config(tokenizer)))


def save_published(path: Path, tokenizer: PreTrainedTokenizerBase) -> Qwen3_5ForConditionalGeneration:
    """A checkpoint as Qwen3.5's are published: the vision-language class, a small vision tower beside the text
    model; saved with the tokenizer to `path` and returned."""
    vision = dict(depth=1, hidden_size=16, num_heads=2, intermediate_size=32, out_hidden_size=32)
    torch.manual_seed(0)
    published = Qwen3_5ForConditionalGeneration(Qwen3_5Config(text_config=text_config(tokenizer),
                                                              vision_config=vision))
    published.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return published
