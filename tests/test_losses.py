"""Clipped policy loss with decoupled clipping, KL estimators, value loss: hand-computed expectations."""

import math

import pytest
import torch

from ragen.losses import (aggregate, aggregation_share, explained_variance, kl_penalty, ppo_clip_loss, token_share,
                          value_loss)


def ratios_to_logprobs(ratios):
    return torch.log(torch.tensor([ratios])), torch.zeros(1, len(ratios))


def test_decoupled_clip_by_hand():
    # eps_low 0.2, eps_high 0.28; ratios and advantages chosen to hit each branch
    logp, old = ratios_to_logprobs([1.5, 1.1, 0.5, 0.9, 1.5])
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0, -1.0]])
    mask = torch.ones(1, 5, dtype=torch.bool)
    loss, stats = ppo_clip_loss(logp, old, adv, mask, eps_low=0.2, eps_high=0.28)
    # t0: A>0, r=1.5 clipped to 1.28 -> max(-1.5, -1.28) = -1.28
    # t1: A>0, r=1.1 inside -> -1.1
    # t2: A<0, r=0.5 clipped to 0.8 -> max(0.5, 0.8) = 0.8
    # t3: A<0, r=0.9 inside -> 0.9
    # t4: A<0, r=1.5 (upper clip does not bind for A<0) -> max(1.5, 1.28) = 1.5
    expected = (-1.28 - 1.1 + 0.8 + 0.9 + 1.5) / 5
    assert loss.item() == pytest.approx(expected, abs=1e-5)
    assert stats["clipfrac_high"] == pytest.approx(1 / 5)
    assert stats["clipfrac_low"] == pytest.approx(1 / 5)


def test_symmetric_clip_differs_from_clip_higher():
    logp, old = ratios_to_logprobs([1.25])
    adv, mask = torch.tensor([[2.0]]), torch.ones(1, 1, dtype=torch.bool)
    sym, _ = ppo_clip_loss(logp, old, adv, mask, eps_low=0.2, eps_high=0.2)
    higher, _ = ppo_clip_loss(logp, old, adv, mask, eps_low=0.2, eps_high=0.28)
    assert sym.item() == pytest.approx(-2 * 1.2) and higher.item() == pytest.approx(-2 * 1.25)


def test_dual_clip_caps_negative_advantages():
    logp, old = ratios_to_logprobs([5.0])
    adv, mask = torch.tensor([[-1.0]]), torch.ones(1, 1, dtype=torch.bool)
    plain, _ = ppo_clip_loss(logp, old, adv, mask, eps_low=0.2, eps_high=0.28)
    dual, stats = ppo_clip_loss(logp, old, adv, mask, eps_low=0.2, eps_high=0.28, dual_clip=3.0)
    assert plain.item() == pytest.approx(5.0) and dual.item() == pytest.approx(3.0)
    assert stats["clipfrac_dual"] == 1.0


def test_masked_tokens_do_not_count_and_gradient_flows():
    logp = torch.zeros(1, 3, requires_grad=True)
    adv = torch.tensor([[1.0, 100.0, 1.0]])
    mask = torch.tensor([[True, False, True]])
    loss, stats = ppo_clip_loss(logp, torch.zeros(1, 3), adv, mask, eps_low=0.2, eps_high=0.28)
    assert loss.item() == pytest.approx(-1.0)
    loss.backward()
    # d/dlogp of -A r at r = 1 is -A, averaged over 2 masked tokens
    assert logp.grad[0].tolist() == pytest.approx([-0.5, 0.0, -0.5])
    assert stats["approx_kl"] == 0.0


def test_sequence_mean_aggregation_by_hand():
    per_token = torch.tensor([[1.0, 3.0, 0.0], [10.0, 0.0, 0.0]])
    mask = torch.tensor([[True, True, False], [True, False, False]])
    assert aggregate(per_token, mask, "token-mean").item() == pytest.approx(14 / 3)
    assert aggregate(per_token, mask, "seq-mean-token-mean").item() == pytest.approx((2 + 10) / 2)


def test_kl_estimators_by_hand():
    logp, ref = torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.25)])
    k1 = kl_penalty(logp, ref, "k1").item()
    assert k1 == pytest.approx(math.log(2))
    assert kl_penalty(logp, ref, "k3").item() == pytest.approx(0.5 - 1 + math.log(2))
    with pytest.raises(ValueError):
        kl_penalty(logp, ref, "k2")


def test_value_loss_with_clip_by_hand():
    values = torch.tensor([[1.0, 0.0]])
    old = torch.tensor([[0.0, 0.0]])
    returns = torch.tensor([[2.0, 0.5]])
    mask = torch.ones(1, 2, dtype=torch.bool)
    loss, stats = value_loss(values, old, returns, mask, clip=0.5)
    # t0: unclipped (1-2)^2 = 1; clipped V = 0.5 -> (0.5-2)^2 = 2.25; max 2.25
    # t1: both (0-0.5)^2 = 0.25.  0.5 * mean(2.25, 0.25) = 0.625
    assert loss.item() == pytest.approx(0.625) and stats["value_clipfrac"] == pytest.approx(0.5)


def test_explained_variance():
    returns = torch.tensor([[1.0, 2.0, 3.0]])
    mask = torch.ones(1, 3, dtype=torch.bool)
    assert explained_variance(returns, returns, mask) == pytest.approx(1.0)
    assert explained_variance(torch.full((1, 3), 2.0), returns, mask) == pytest.approx(0.0)


def test_shares_of_a_micro_batch_by_hand():
    """Rows with 2, 1, 0 and 3 masked tokens: 6 tokens in 3 sequences with any. The first two rows hold 3 of the 6
    tokens and 2 of the 3 sequences; verl's weight would be 2 / 4 rows for both."""
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0], [1, 1, 1]], dtype=torch.bool)
    assert token_share(mask[:2], mask) == 0.5
    assert aggregation_share(mask[:2], mask, "token-mean") == 0.5
    assert aggregation_share(mask[:2], mask, "seq-mean-token-mean") == pytest.approx(2 / 3)
    assert aggregation_share(mask[2:3], mask, "seq-mean-token-mean") == 0.0
    assert token_share(mask[2:3], mask[2:3]) == 0.0  # no token in the whole: no weight, not a division by zero
    with pytest.raises(ValueError, match="unknown aggregation 'sum'"):
        aggregation_share(mask, mask, "sum")


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_weighted_micro_batch_aggregates_sum_to_the_whole(mode):
    """sum_k w_k aggregate(x_k) = aggregate(x) over uneven micro-batches (3 + 2 + 1 rows) with rows of no token."""
    x = torch.arange(24, dtype=torch.float32).reshape(6, 4) ** 1.5
    mask = torch.tensor([[1, 1, 1, 0], [0, 0, 0, 0], [1, 0, 0, 0], [1, 1, 1, 1], [0, 1, 1, 0], [0, 0, 0, 1]]).bool()
    parts = [slice(0, 3), slice(3, 5), slice(5, 6)]
    summed = sum(aggregation_share(mask[p], mask, mode) * aggregate(x[p], mask[p], mode) for p in parts)
    assert float(summed) == pytest.approx(float(aggregate(x, mask, mode)), rel=1e-6)
    rows = sum(p.stop - p.start for p in parts)
    verl = sum((p.stop - p.start) / rows * aggregate(x[p], mask[p], mode) for p in parts)  # mean of the parts' means
    assert float(verl) != pytest.approx(float(aggregate(x, mask, mode)), rel=1e-3)
