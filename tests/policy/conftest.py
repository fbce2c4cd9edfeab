import pytest
import torch
from transformers import MptConfig, MptForCausalLM, Qwen3_5ForCausalLM, Qwen3_5TextConfig
from windowed import windowed_model

from ragen.policy import Policy
from ragen.policy.model import build_tiny_model
from ragen.policy.tokenizer import env_corpus, train_tokenizer

TAGS = ["bandit", "sokoban", "frozen_lake", "countdown"]


@pytest.fixture(scope="session")
def tokenizer():
    return train_tokenizer(env_corpus(TAGS, episodes_per_env=8, seed=0), vocab_size=512)


@pytest.fixture(scope="session")
def policy(tokenizer):
    model = build_tiny_model(tokenizer, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                             intermediate_size=128, max_positions=1024, seed=0)
    return Policy(model.eval(), tokenizer)


@pytest.fixture(scope="session")
def recurrent_policy(tokenizer):
    """A random Qwen3.5 text model: three linear-attention (Gated DeltaNet) layers, whose state moves at every
    position fed, masked or not, and one attention layer."""
    config = Qwen3_5TextConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                               num_attention_heads=4, num_key_value_heads=2, head_dim=16, linear_key_head_dim=16,
                               linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
                               max_position_embeddings=1024, eos_token_id=tokenizer.eos_token_id,
                               pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    return Policy(Qwen3_5ForCausalLM(config).eval(), tokenizer)


@pytest.fixture(scope="session")
def alibi_policy(tokenizer):
    """A random MPT: ALiBi biases by key index and no position ids, so a masked hole adds distance."""
    config = MptConfig(vocab_size=len(tokenizer), d_model=64, n_heads=4, n_layers=2, expansion_ratio=2,
                       max_seq_len=1024, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    return Policy(MptForCausalLM(config).eval(), tokenizer)


@pytest.fixture(scope="session")
def windowed_policy(tokenizer):
    """`windowed_model` with a window of 24 slots: a session's first turn fits in it, its later turns do not; the
    scoring tests' shared prefix (23 tokens) fits, their rows (28-30) do not."""
    return Policy(windowed_model(tokenizer, 24), tokenizer)


@pytest.fixture(scope="session")
def narrow_window_policy(tokenizer):
    """A window of 8 slots, shorter than the scoring tests' shared prefix."""
    return Policy(windowed_model(tokenizer, 8), tokenizer)


@pytest.fixture(params=["attention", "recurrent", "alibi", "windowed"])
def any_policy(request):
    """The tiny policy (attention placed by position ids), a model with recurrent layers, one that places tokens
    by their index and one with a sliding window of cache slots, for what must hold on all of them."""
    return request.getfixturevalue({"attention": "policy", "recurrent": "recurrent_policy", "alibi": "alibi_policy",
                                    "windowed": "windowed_policy"}[request.param])


@pytest.fixture
def generator():
    return torch.Generator().manual_seed(1234)
