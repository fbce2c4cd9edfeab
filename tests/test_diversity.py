"""Response diversity: distinct-2, distinct answers within a group and a batch-wide template, by hand."""

import pytest

from ragen.diversity import distinct_ngrams, response_diversity
from ragen.records import Trajectory, Turn


def turn(ids):
    return Turn(state="", response="", response_ids=tuple(ids), response_logprobs=(0.0,) * len(ids), finish="stop",
                think="", actions=(), executed=0, reward=0.0, penalty=0.0, format_ok=True, actions_valid=True)


def episode(group, *responses, tag="sokoban"):
    return Trajectory(tag=tag, seed=100 + group, group_id=group, turns=tuple(turn(r) for r in responses),
                      env_return=0.0, penalty=0.0, success=False, num_actions=0, end_reason="turns", token_ids=(),
                      sampled_mask=(), sampled_logprobs=(), system_len=0, turn_ends=())


def test_distinct_ngrams_by_hand():
    # bigrams of (1 2 3 1 2) and (2 3): 12 23 31 12 | 23 -> 3 distinct of 5; a bigram never spans two responses
    assert distinct_ngrams([(1, 2, 3, 1, 2), (2, 3)], 2) == pytest.approx(3 / 5)
    assert distinct_ngrams([(1, 2), (2, 1)], 2) == 1.0  # (2, 1) is not (1, 2)
    assert distinct_ngrams([(7,), ()], 2) is None  # no response has two tokens
    assert distinct_ngrams([(5, 5, 5)], 1) == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="n >= 1"):
        distinct_ngrams([(1, 2)], 0)


def test_response_diversity_by_hand():
    batch = [episode(0, (1, 2), (9, 9)), episode(0, (1, 2)), episode(0, (1, 3)), episode(0, (1, 2)),  # 2 of 4
             episode(1, (1, 2)), episode(1, (4,)), episode(1, (5,)), episode(1, (6,))]  # 4 of 4
    stats = response_diversity(batch)
    assert stats["response_distinct_in_group"] == pytest.approx((2 / 4 + 4 / 4) / 2)
    assert stats["response_top_share"] == pytest.approx(4 / 8)  # (1 2) opens four episodes in two groups
    # bigrams: 12, 99 (the second turn counts too), 12, 13, 12, 12 -> {12, 99, 13} of 6
    assert stats["distinct_2"] == pytest.approx(3 / 6)
    # a group is one start of one env: the same group id in another env is another group
    other = [episode(0, (1, 2)), episode(0, (1, 2), tag="frozen_lake"), episode(0, (3, 4), tag="frozen_lake")]
    assert response_diversity(other)["response_distinct_in_group"] == pytest.approx((1 / 1 + 2 / 2) / 2)


def test_a_template_and_one_token_answers():
    template = [episode(g, (1, 2, 3)) for g in range(4) for _ in range(2)]  # the same text for every start
    stats = response_diversity(template)
    assert stats["response_top_share"] == 1.0 and stats["response_distinct_in_group"] == pytest.approx(1 / 2)
    assert stats["distinct_2"] == pytest.approx(2 / 16)
    single = response_diversity([episode(0, (7,)), episode(0, (8,))])
    assert "distinct_2" not in single and single["response_distinct_in_group"] == 1.0
    assert response_diversity([]) == {}
