"""Scoring with a shared prefix: the prefix runs once, values and gradients equal a full pass."""

import torch

from ragen.policy.sampling import left_pad
from ragen.policy.scoring import shared_prefix_length, token_logprobs, token_logprobs_shared_prefix


def test_shared_prefix_length_by_hand():
    ids, mask = left_pad([[5, 6, 7, 8, 9], [5, 6, 7, 3], [5, 6, 7, 8, 2, 2]], 0, torch.device("cpu"))
    loss = torch.zeros_like(ids, dtype=torch.bool)
    assert shared_prefix_length(ids, mask, loss) == 3  # rows part after 5 6 7
    loss[0, -1] = True  # row 0 trains on its last token (real index 4): the prefix may still be 3 long
    assert shared_prefix_length(ids, mask, loss) == 3
    loss[2, -4] = True  # row 2 trains from real index 2 on: the prefix stops before it
    assert shared_prefix_length(ids, mask, loss) == 2
    same, same_mask = left_pad([[4, 4, 4], [4, 4, 4]], 0, torch.device("cpu"))
    assert shared_prefix_length(same, same_mask, torch.zeros_like(same, dtype=torch.bool)) == 2  # one own token left


def test_shared_prefix_scoring_equals_the_full_pass_with_gradients(policy):
    prefix = policy.tokenizer.encode("You are a helpful assistant. Turn 1:\nState:\n", add_special_tokens=False)
    tails = ["#_P#\nUp", "PG\nYou have 3 actions left. Always output:", "Target: 5"]
    sequences = [prefix + policy.tokenizer.encode(t, add_special_tokens=False) for t in tails]
    ids, mask = left_pad(sequences, policy.tokenizer.pad_token_id, torch.device("cpu"))
    loss_mask = torch.zeros_like(ids, dtype=torch.bool)
    for row, seq in enumerate(sequences):  # train on each row's last 4 tokens
        loss_mask[row, -4:] = True
    lp = shared_prefix_length(ids, mask, loss_mask)
    assert lp >= len(prefix)
    weights = torch.randn(ids.shape)

    def loss_and_grads(scores):
        policy.model.zero_grad(set_to_none=True)
        loss = (scores * loss_mask * weights).sum()
        loss.backward()
        return scores.detach(), {n: p.grad.clone() for n, p in policy.model.named_parameters() if p.grad is not None}

    policy.model.train()
    try:
        full, full_grads = loss_and_grads(token_logprobs(policy.model, ids, mask)[0])
        shared, shared_grads = loss_and_grads(token_logprobs_shared_prefix(policy.model, ids, mask, lp))
    finally:
        policy.model.zero_grad(set_to_none=True)
        policy.model.eval()
    for row, seq in enumerate(sequences):
        own = slice(ids.shape[1] - len(seq) + lp, None)
        assert torch.allclose(shared[row, own], full[row, own], atol=1e-5)
        assert (shared[row, : ids.shape[1] - len(seq) + lp] == 0).all()
    assert full_grads.keys() == shared_grads.keys()
    for name, grad in full_grads.items():
        assert torch.allclose(shared_grads[name], grad, atol=1e-5), name
