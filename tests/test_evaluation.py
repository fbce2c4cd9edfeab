"""Evaluation: several episodes per instance, per-instance success and its standard error over instances."""

import math
from dataclasses import replace

import pytest
import torch

from ragen.config import RolloutConfig
from ragen.evaluation import (evaluate_policy, instance_success, mean_and_se, mean_and_se_over_seeds,
                              paired_gap)
from ragen.policy import Policy
from ragen.policy.model import build_tiny_model
from ragen.policy.tokenizer import env_corpus, train_tokenizer


@pytest.fixture(scope="module")
def policy():
    tokenizer = train_tokenizer(env_corpus(["bandit", "frozen_lake"], episodes_per_env=6), vocab_size=320)
    model = build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                             intermediate_size=64, max_positions=2048, seed=0)
    return Policy(model.eval(), tokenizer)


def test_mean_and_se_by_hand():
    # x = 1, 0, 0, 1: mean 1/2; unbiased var (4 * 1/4) / 3 = 1/3; se = sqrt(1/3) / 2
    mean, se = mean_and_se([1.0, 0.0, 0.0, 1.0])
    assert mean == 0.5 and se == pytest.approx(math.sqrt(1 / 3) / 2)
    # paired differences: the same shift on every instance has no spread, so no standard error
    assert mean_and_se([0.25, 0.25, 0.25]) == (0.25, 0.0)
    assert mean_and_se([0.7]) == (0.7, 0.0)
    with pytest.raises(ValueError, match="zero instances"):
        mean_and_se([])


def test_mean_and_se_over_seeds_by_hand():
    # seeds A, B on 3 instances: d_A = 0.5, 0, -0.25; d_B = 0.25, 0, 0.25
    # d_i = 0.375, 0, 0: mean 0.125; sd_i = sqrt((0.0625 + 0.015625 + 0.015625) / 2) = 0.216506; / sqrt(3) = 0.125
    # seed means 1/12 and 1/6: sd = (1/12) / sqrt(2); / sqrt(2) = 1/24
    mean, se_inst, se_seed = mean_and_se_over_seeds([[0.5, 0.0, -0.25], [0.25, 0.0, 0.25]])
    assert mean == pytest.approx(0.125) and se_inst == pytest.approx(0.125) and se_seed == pytest.approx(1 / 24)
    # two seeds with the same gaps on the same instances: the instances' spread stays whole (not / sqrt(2))
    same = [[1.0, 0.0, 0.0, 1.0]] * 2
    assert mean_and_se_over_seeds(same) == pytest.approx((0.5, math.sqrt(1 / 3) / 2, 0.0))
    assert mean_and_se_over_seeds([[0.2, 0.4]]) == pytest.approx((0.3, 0.1, 0.0))  # one seed: its paired se
    with pytest.raises(ValueError, match="same 2 instances"):
        mean_and_se_over_seeds([[0.1, 0.2], [0.3]])
    with pytest.raises(ValueError, match="zero seeds"):
        mean_and_se_over_seeds([])


def test_more_samples_extend_the_one_sample_evaluation(policy):
    cfg = RolloutConfig(max_new_tokens=12, max_turns=2)
    seeds = [5, 9, 17]
    one, first = evaluate_policy(policy, "frozen_lake", seeds, cfg, temperature=1.0, seed=4)
    many, trajectories = evaluate_policy(policy, "frozen_lake", seeds, cfg, temperature=1.0, seed=4, samples=4)
    assert len(first) == 3 and len(trajectories) == 12
    assert trajectories[:3] == first  # pass 0 is the one-sample evaluation: the same random stream
    assert [t.seed for t in trajectories] == seeds * 4
    assert trajectories[3:6] != first  # later passes sample again
    per_instance = instance_success(trajectories, 3)
    assert per_instance == [sum(trajectories[r * 3 + i].success for r in range(4)) / 4 for i in range(3)]
    assert many["success_rate"] == pytest.approx(sum(per_instance) / 3)
    assert many["success_se"] == pytest.approx(mean_and_se(per_instance)[1])
    assert one["success_se"] == pytest.approx(mean_and_se([float(t.success) for t in first])[1])
    with pytest.raises(ValueError, match="eval.samples must be at least 1"):
        evaluate_policy(policy, "frozen_lake", seeds, cfg, temperature=1.0, samples=0)
    with pytest.raises(ValueError, match="no frozen_lake instances to evaluate: eval.episodes"):
        evaluate_policy(policy, "frozen_lake", [], cfg, temperature=1.0)


def test_instance_success_needs_whole_passes(policy):
    _, trajectories = evaluate_policy(policy, "bandit", [1, 2], RolloutConfig(max_new_tokens=8), temperature=1.0)
    with pytest.raises(ValueError, match="not whole passes over 3 instances"):
        instance_success(trajectories, 3)


def test_paired_gap_by_hand(policy):
    _, played = evaluate_policy(policy, "bandit", [1, 2, 3], RolloutConfig(max_new_tokens=8), temperature=1.0,
                                samples=2)

    def outcomes(successes):  # the same six episodes (3 instances x 2 passes) with the given successes
        return [replace(t, success=bool(s)) for t, s in zip(played, successes)]
    # pass by pass: instance i is episodes i and 3 + i
    trained = outcomes([1, 1, 0, 1, 0, 0])  # per instance 1, 0.5, 0
    base = outcomes([0, 1, 0, 0, 0, 1])  # per instance 0, 0.5, 0.5
    # d = 1, 0, -0.5: mean 1/6; unbiased var ((5/6)^2 + (1/6)^2 + (2/3)^2) / 2 = 7/12; se = sqrt(7/12 / 3)
    gap, se = paired_gap(trained, base, 3)
    assert gap == pytest.approx(1 / 6) and se == pytest.approx(math.sqrt(7 / 36))
    assert paired_gap(base, base, 3) == (0.0, 0.0)
    with pytest.raises(ValueError, match="base evaluation played 3 episodes and the trained one 6"):
        paired_gap(trained, base[:3], 3)
    with pytest.raises(ValueError, match="played other instances"):
        paired_gap(trained, base[::-1], 3)
