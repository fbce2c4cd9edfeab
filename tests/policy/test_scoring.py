"""Scoring with a shared prefix: the prefix runs once, values and gradients equal a full pass."""

import torch

from ragen.policy.sampling import left_pad
from ragen.policy.model import build_critic, value_head
from ragen.policy.scoring import (MIN_SHARED_PREFIX, score_sequences, score_values, shareable_prefix,
                                  shared_prefix_length, token_logprobs, token_values)


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


def test_shareable_prefix_needs_several_rows_and_a_long_enough_prefix():
    long = list(range(1, MIN_SHARED_PREFIX + 1))
    ids, mask = left_pad([long + [40, 41], long + [50]], 0, torch.device("cpu"))
    loss = torch.zeros_like(ids, dtype=torch.bool)
    assert shareable_prefix(ids, mask, loss) == MIN_SHARED_PREFIX
    assert shareable_prefix(ids[:1], mask[:1], loss[:1]) == 0  # one row: nothing to share
    loss[:, -2:] = True  # row 0 trains from its 17th real token on, row 1 from its 16th: the prefix is cut to 15
    assert shareable_prefix(ids, mask, loss) == 0


def shared_rows(tokenizer):
    """Three left-padded conversations behind one prompt; each trains on its last 4 tokens."""
    prefix = tokenizer.encode("You are a helpful assistant. Turn 1:\nState:\n", add_special_tokens=False)
    tails = ["#_P#\nUp", "PG\nYou have 3 actions left. Always output:", "Target: 5"]
    sequences = [prefix + tokenizer.encode(t, add_special_tokens=False) for t in tails]
    ids, mask = left_pad(sequences, tokenizer.pad_token_id, torch.device("cpu"))
    loss_mask = torch.zeros_like(ids, dtype=torch.bool)
    for row, seq in enumerate(sequences):
        loss_mask[row, -4:] = True
    lp = shared_prefix_length(ids, mask, loss_mask)
    assert lp >= len(prefix)
    return sequences, ids, mask, loss_mask, lp


def assert_same_as_full_pass(model, score, sequences, ids, loss_mask, lp):
    """`score(prefix_len)` -> (B, T) tensors; with the prefix run once, their values on each row's own tokens and
    the gradients of a weighted loss over the trained tokens equal the full pass; the prefix positions are 0."""
    weights = torch.randn(ids.shape)

    def loss_and_grads(scores):
        model.zero_grad(set_to_none=True)
        (sum(scores) * loss_mask * weights).sum().backward()
        return [t.detach() for t in scores], {n: p.grad.clone() for n, p in model.named_parameters()
                                                if p.grad is not None}

    model.train()
    try:
        full, full_grads = loss_and_grads(score(0))
        shared, shared_grads = loss_and_grads(score(lp))
    finally:
        model.zero_grad(set_to_none=True)
        model.eval()
    for full_t, shared_t in zip(full, shared):
        for row, seq in enumerate(sequences):
            own = slice(ids.shape[1] - len(seq) + lp, None)
            assert torch.allclose(shared_t[row, own], full_t[row, own], atol=1e-5)
            assert (shared_t[row, : ids.shape[1] - len(seq) + lp] == 0).all()
    assert full_grads.keys() == shared_grads.keys()
    for name, grad in full_grads.items():
        assert torch.allclose(shared_grads[name], grad, atol=1e-5), name


def test_shared_prefix_logprobs_and_entropy_equal_the_full_pass_with_gradients(any_policy):
    policy = any_policy
    sequences, ids, mask, loss_mask, lp = shared_rows(policy.tokenizer)
    score = lambda prefix_len: token_logprobs(policy.model, ids, mask, with_entropy=True,  # noqa: E731
                                              prefix_len=prefix_len)
    assert_same_as_full_pass(policy.model, score, sequences, ids, loss_mask, lp)


def test_shared_prefix_values_equal_the_full_pass_with_gradients(any_policy):
    policy = any_policy
    sequences, ids, mask, loss_mask, lp = shared_rows(policy.tokenizer)
    critic = build_critic(policy.model)
    torch.nn.init.normal_(value_head(critic).weight, std=0.1)  # a zero head would make every value 0
    score = lambda prefix_len: (token_values(critic, ids, mask, prefix_len=prefix_len),)  # noqa: E731
    assert_same_as_full_pass(critic, score, sequences, ids, loss_mask, lp)


def test_a_shared_prefix_longer_than_a_window_runs_the_rows_whole(narrow_window_policy, tokenizer):
    """A sliding-window layer's cache keeps its last window - 1 keys, so a prefix that long cannot be broadcast (its
    first keys would be gone): the rows run whole, with the full pass's values and gradients."""
    policy = narrow_window_policy
    sequences, ids, mask, loss_mask, lp = shared_rows(tokenizer)
    assert lp >= 8
    score = lambda prefix_len: token_logprobs(policy.model, ids, mask, with_entropy=True,  # noqa: E731
                                              prefix_len=prefix_len)
    assert_same_as_full_pass(policy.model, score, sequences, ids, loss_mask, lp)


def test_padding_every_row_shares_is_not_run(any_policy):
    """A micro-batch of one row keeps its batch's width; the columns of padding in front of it do not run (the
    model sees the row's own tokens only), and its log-probs, entropies and values equal those of the row scored
    alone, with 0 on the padding."""
    policy = any_policy
    sequences, ids, mask, _, _ = shared_rows(policy.tokenizer)
    row = min(range(len(sequences)), key=lambda r: len(sequences[r]))  # the shortest: padding in front of it
    alone = torch.tensor([sequences[row]])
    pad = ids.shape[1] - len(sequences[row])
    assert pad > 0
    critic = build_critic(policy.model)
    torch.nn.init.normal_(value_head(critic).weight, std=0.1)
    widths = []
    hooks = [m.register_forward_pre_hook(lambda _m, args, kw: widths.append(kw["input_ids"].shape[1]),
                                         with_kwargs=True) for m in (policy.model, critic)]
    try:
        sliced = token_logprobs(policy.model, ids[row:row + 1], mask[row:row + 1], with_entropy=True)
        values = token_values(critic, ids[row:row + 1], mask[row:row + 1])
    finally:
        for hook in hooks:
            hook.remove()
    assert widths == [len(sequences[row])] * 2
    whole = token_logprobs(policy.model, alone, torch.ones_like(alone), with_entropy=True)
    whole_values = token_values(critic, alone, torch.ones_like(alone))
    for got, expected in [*zip(sliced, whole), (values, whole_values)]:
        assert got.shape == (1, ids.shape[1]) and (got[0, :pad] == 0).all()
        assert torch.allclose(got[0, pad:], expected[0], atol=1e-5)


def test_scoring_in_passes_of_any_rows_puts_each_row_back_in_place(policy):
    """score_sequences / score_values over passes of row indices in any order (longest first, as
    `ragen.update.micro_batches` gives them) equal one pass over the batch on every token a real one precedes, row
    for row; with the prefix run once too."""
    sequences, ids, mask, _, lp = shared_rows(policy.tokenizer)
    critic = build_critic(policy.model)
    torch.nn.init.normal_(value_head(critic).weight, std=0.1)
    passes = [torch.tensor([2, 0]), torch.tensor([1])]
    real = torch.zeros_like(mask, dtype=torch.bool)  # real tokens after a real one (the first has no context)
    real[:, 1:] = mask[:, 1:].bool() & mask[:, :-1].bool()
    for prefix_len in (0, lp):
        one = score_sequences(policy.model, ids, mask, passes=[torch.arange(3)], prefix_len=prefix_len)
        split = score_sequences(policy.model, ids, mask, passes=passes, prefix_len=prefix_len)
        values = score_values(critic, ids, mask, passes=passes, prefix_len=prefix_len)
        for got, expected in [*zip(split, one), (values, score_values(critic, ids, mask, prefix_len=prefix_len))]:
            assert got.shape == ids.shape and torch.allclose(got[real], expected[real], atol=1e-5)
    assert score_sequences(policy.model, ids, mask, passes=passes, with_entropy=False)[1] is None
