"""A random tiny Qwen2 for tests (no download) whose first layer attends over a sliding window of the last `window`
cache slots and whose second sees them all, as Gemma 2 and 3, GPT-OSS and OLMo 3 mix sliding-window and full layers
(`ragen.policy.scoring.attention_window`); weights large enough that a key pushed out of the window would show."""

import torch
from transformers import PreTrainedTokenizerBase, Qwen2Config, Qwen2ForCausalLM


def windowed_model(tokenizer: PreTrainedTokenizerBase, window: int) -> Qwen2ForCausalLM:
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, use_sliding_window=True, sliding_window=window,
                         layer_types=["sliding_attention", "full_attention"], max_position_embeddings=2048,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                         initializer_range=0.2)
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config).eval()
