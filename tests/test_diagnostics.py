"""First-action diagnostics: Miller-Madow entropies by hand, and what they say of random, state-reading and
template policies."""

import itertools
import math
import random
from collections import Counter

import pytest

from ragen.config import RolloutConfig
from ragen.diagnostics import (NO_ACTION, action_dependence, expected_plugin_entropy, first_action,
                               first_action_bonus, miller_madow_entropy, plugin_entropy)
from ragen.policy.chat import ChatRenderer
from ragen.policy.sampling import Sample
from ragen.policy.tokenizer import env_corpus, train_tokenizer
from ragen.records import EpisodeSpec, Trajectory, Turn
from ragen.rollout import run_episodes


def turn(actions):
    return Turn(state="", response="", response_ids=(), response_logprobs=(), finish="stop", think="",
                actions=tuple(actions), executed=len(actions), reward=0.0, penalty=0.0, format_ok=bool(actions),
                actions_valid=bool(actions))


def episode(seed, *first_turn_actions, tag="sokoban"):
    return Trajectory(tag=tag, seed=seed, group_id=seed, turns=(turn(first_turn_actions), turn(["Up"])),
                      env_return=0.0, penalty=0.0, success=False, num_actions=1, end_reason="turns", token_ids=(),
                      sampled_mask=(), sampled_logprobs=(), system_len=0, turn_ends=())


def batch(first_actions_by_seed):
    return [episode(seed, a) for seed, actions in first_actions_by_seed.items() for a in actions]


def test_miller_madow_entropy_by_hand():
    # counts 2, 2: plug-in ln 2, m = 2 values of n = 4 draws add (2 - 1) / 8
    assert miller_madow_entropy([2, 2]) == pytest.approx(math.log(2) + 1 / 8)
    # counts 3, 1, 0: plug-in -(3/4 ln 3/4 + 1/4 ln 1/4); the zero count is no value seen: + 1 / 8
    assert miller_madow_entropy([3, 1, 0]) == pytest.approx(-(0.75 * math.log(0.75) + 0.25 * math.log(0.25)) + 1 / 8)
    assert miller_madow_entropy([5]) == 0.0 and miller_madow_entropy([1]) == 0.0
    with pytest.raises(ValueError, match="empty sample"):
        miller_madow_entropy([0, 0])
    with pytest.raises(ValueError, match="non-negative"):
        miller_madow_entropy([2, -1])


def test_expected_plugin_entropy_by_hand_and_against_enumeration():
    # two draws: the entropy is ln 2 when they differ, with probability sum_k p_k (1 - p_k), else 0
    p = [1 / 2, 1 / 6, 1 / 3]
    assert expected_plugin_entropy(2, p) == pytest.approx(math.log(2) * (1 / 4 + 5 / 36 + 2 / 9))
    assert expected_plugin_entropy(5, [1.0]) == 0.0 and expected_plugin_entropy(1, p) == 0.0
    # slow oracle: every sequence of 4 draws, weighted by its probability
    oracle = sum(math.prod(p[k] for k in seq) * plugin_entropy([seq.count(k) for k in range(3)])
                 for seq in itertools.product(range(3), repeat=4))
    assert expected_plugin_entropy(4, p) == pytest.approx(oracle)
    assert plugin_entropy([2, 2, 0]) == pytest.approx(math.log(2))


def test_state_reading_policy_has_the_information_a_template_has_none():
    # two instances, two rollouts each; the policy reads the state: Up on seed 1, Down on seed 2
    reading = action_dependence(batch({1: ["Up", "Up"], 2: ["Down", "Down"]}))
    h = math.log(2) + 1 / 8  # marginal counts 2, 2 of n = 4
    # p = (1/2, 1/2); two draws from it differ half the time: E[H^] = ln 2 / 2; each instance shows H^ = 0
    assert reading["first_action_entropy"] == pytest.approx(h)
    assert reading["first_action_mi"] == pytest.approx(math.log(2) / 2)
    assert reading["first_action_cond_entropy"] == pytest.approx(h - math.log(2) / 2)
    assert reading["first_action_top_share"] == 0.5
    # the template: Down everywhere -> no entropy, no information
    template = action_dependence(batch({1: ["Down", "Down"], 2: ["Down", "Down"]}))
    assert template == {"first_action_entropy": 0.0, "first_action_top_share": 1.0,
                        "first_action_mi": 0.0, "first_action_cond_entropy": 0.0}
    # each instance shows both actions, more alike than chance: the estimate reads below 0
    mixed = action_dependence(batch({1: ["Up", "Down"], 2: ["Down", "Up"]}))
    assert mixed["first_action_mi"] == pytest.approx(math.log(2) / 2 - math.log(2))
    assert mixed["first_action_entropy"] == reading["first_action_entropy"]


def test_a_random_opening_reads_no_information_on_average():
    # 64 instances x 4 rollouts, uniform over 4 actions whatever the instance: I(A; X) is 0 within its noise, where
    # the difference of Miller-Madow entropies H(A) - sum_x H(A | X = x) / 64 reads about 0.27 nats
    rng = random.Random(0)
    estimates, miller_madow = [], []
    for _ in range(20):
        opening = {s: [rng.choice("ABCD") for _ in range(4)] for s in range(64)}
        out = action_dependence(batch(opening))
        estimates.append(out["first_action_mi"])
        miller_madow.append(out["first_action_entropy"] -
                            sum(miller_madow_entropy(Counter(a).values()) for a in opening.values()) / 64)
    assert abs(sum(estimates) / 20) < 0.02
    assert 0.2 < sum(miller_madow) / 20 < 0.35


def test_unequal_groups_weigh_by_their_rollouts_and_instances_are_tag_and_seed():
    trajectories = batch({1: ["Up", "Up", "Up", "Left"], 2: ["Down", "Down"]})
    out = action_dependence(trajectories)
    p = [3 / 6, 1 / 6, 2 / 6]
    mi = 4 / 6 * (expected_plugin_entropy(4, p) - plugin_entropy([3, 1])) + 2 / 6 * expected_plugin_entropy(2, p)
    assert out["first_action_entropy"] == pytest.approx(miller_madow_entropy([3, 1, 2]))
    assert out["first_action_mi"] == pytest.approx(mi) and out["first_action_top_share"] == 0.5
    assert out["first_action_cond_entropy"] == pytest.approx(out["first_action_entropy"] - mi)
    # the same seed in another env is another instance: each shows one action, more alike than chance
    mixed = [episode(1, "Up"), episode(1, "Up"), episode(1, "Down", tag="frozen_lake"),
             episode(1, "Down", tag="frozen_lake")]
    assert action_dependence(mixed)["first_action_mi"] == pytest.approx(math.log(2) / 2)


def test_one_rollout_per_instance_gives_no_conditional_estimate():
    out = action_dependence(batch({1: ["Up"], 2: ["Down"], 3: ["Down"]}))
    assert set(out) == {"first_action_entropy", "first_action_top_share"}
    assert out["first_action_top_share"] == pytest.approx(2 / 3)
    assert action_dependence([]) == {}


def test_first_action_of_real_rollouts_and_a_malformed_first_turn():
    tokenizer = train_tokenizer(env_corpus(["sokoban"], episodes_per_env=6), vocab_size=400)
    turns = iter(["go</think><answer>Left || Up</answer>", "x</think><answer>Up</answer>"] +
                 ["no tags at all", "y</think><answer>Down</answer>"])

    def respond(prompts, envs):
        ids = tokenizer.encode(next(turns), add_special_tokens=False)
        return [Sample(tuple(ids), (-0.5,) * len(ids), "stop") for _ in prompts]

    cfg = RolloutConfig(max_turns=2)
    renderer = ChatRenderer(tokenizer, "<think>")
    parsed, = run_episodes([EpisodeSpec("sokoban", 4)], respond, renderer, cfg, max_positions=4096)
    malformed, = run_episodes([EpisodeSpec("sokoban", 4)], respond, renderer, cfg, max_positions=4096)
    assert first_action(parsed) == "Left"
    assert malformed.turns[0].actions == () and first_action(malformed) == NO_ACTION
    assert action_dependence([parsed, malformed])["first_action_top_share"] == 0.5


def test_first_action_bonus_by_hand():
    # seed 1 opens Up, Up, Up, Down; seed 2 opens Down, Down, Left and one turn that parsed no action, which gets 0
    # and counts nowhere: over the 7 parsed openings p(Up) = p(Down) = 3/7, p(Left) = 1/7
    trajectories = batch({1: ["Up", "Up", "Up", "Down"], 2: ["Down", "Down", "Left"]}) + [episode(2)]
    entropy = first_action_bonus(trajectories, "entropy")
    assert entropy == pytest.approx([math.log(7 / 3)] * 6 + [math.log(7), 0.0])
    # mi adds ln p(a | x): seed 1's Up 3/4, its Down 1/4; seed 2's Down 2/3, its Left 1/3
    mi = first_action_bonus(trajectories, "mi")
    up, down = math.log(3 / 4) + math.log(7 / 3), math.log(1 / 4) + math.log(7 / 3)
    down2, left2 = math.log(2 / 3) + math.log(7 / 3), math.log(1 / 3) + math.log(7)
    assert mi == pytest.approx([up, up, up, down, down2, down2, left2, 0.0])
    # over the parsed openings their means are the plug-in H^(A) and I^(A; X) = H^(A) - H^(A | X)
    assert sum(entropy) / 7 == pytest.approx(plugin_entropy([3, 3, 1]))
    cond = (4 * plugin_entropy([3, 1]) + 3 * plugin_entropy([2, 1])) / 7
    assert sum(mi) / 7 == pytest.approx(plugin_entropy([3, 3, 1]) - cond)


def test_first_action_bonus_of_a_template_is_zero_and_an_unknown_kind_is_named():
    template = batch({1: ["Down"] * 4, 2: ["Down"] * 4})
    assert first_action_bonus(template, "entropy") == [0.0] * 8
    assert first_action_bonus(template, "mi") == [0.0] * 8
    assert first_action_bonus([episode(1), episode(2)], "entropy") == [0.0, 0.0]  # no parsed opening at all
    with pytest.raises(ValueError, match="unknown first-action bonus 'info'; use entropy or mi"):
        first_action_bonus(template, "info")
