import pytest
import torch

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


@pytest.fixture
def generator():
    return torch.Generator().manual_seed(1234)
