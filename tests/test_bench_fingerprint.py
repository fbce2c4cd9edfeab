"""bench/bench_fingerprint.py: its hashes repeat on one machine and move with a last-bit change in the weights."""

import copy

import pytest
import torch

from benchload import load_bench
from ragen.policy import Policy
from ragen.policy.model import build_tiny_model
from ragen.policy.tokenizer import env_corpus, train_tokenizer

bench_fingerprint = load_bench("bench_fingerprint")


@pytest.fixture(scope="module")
def policy():
    tokenizer = train_tokenizer(env_corpus(["bandit", "sokoban"], episodes_per_env=8, seed=0), vocab_size=512)
    model = build_tiny_model(tokenizer, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                             intermediate_size=128, max_positions=1024, seed=0)
    return Policy(model.eval(), tokenizer)


def test_same_policy_same_fingerprint_and_weights_untouched(policy):
    before = [p.detach().clone() for p in policy.model.parameters()]
    first = bench_fingerprint.fingerprint(policy, bandit=4, sokoban=1)
    assert all(torch.equal(a, b) for a, b in zip(before, policy.model.parameters()))  # training ran on a copy
    assert bench_fingerprint.fingerprint(policy, bandit=4, sokoban=1) == first
    assert len(first["sampling"]["per_episode"].split()) == 5
    assert first["sampling"]["successes"].endswith("/5")


def test_a_last_bit_change_shows_in_kernels_and_training(policy):
    nudged = Policy(copy.deepcopy(policy.model), policy.tokenizer)
    with torch.no_grad():
        weight = nudged.model.lm_head.weight
        weight[5, 3] = torch.nextafter(weight[5, 3], torch.tensor(1.0))  # one ulp on one weight
    base = bench_fingerprint.fingerprint(policy, bandit=2, sokoban=0)
    moved = bench_fingerprint.fingerprint(nudged, bandit=2, sokoban=0)
    assert moved["rng"] == base["rng"]
    assert moved["kernels"]["logits_full"] != base["kernels"]["logits_full"]
    assert moved["kernels"]["matmul"] == base["kernels"]["matmul"]
    assert moved["training"]["weights"] != base["training"]["weights"]
