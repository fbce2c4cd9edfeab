"""The online loop's pieces: group seeding, selection, and determinism of a whole step."""

import json
import math
import random
from dataclasses import replace

import pytest
import torch

from ragen.config import ConfigError, load_config
from ragen.diagnostics import first_action_bonus
from ragen.envs import make_env
from ragen.policy import Policy
from ragen.policy.model import build_critic, build_tiny_model
from ragen.policy.tokenizer import env_corpus, train_tokenizer
from ragen.policy.scoring import score_sequences, shareable_prefix
from ragen.shaping import make_potential
from ragen.train import (Learner, collect, critic_batch, make_batch, return_batch, select, step_specs, train_step,
                         warm_critic)

CFG = ["train.env=frozen_lake", "train.groups=3", "train.group_size=4", "train.mini_batch_size=6",
       "rollout.max_new_tokens=10", "rollout.max_turns=2", "filter.keep_ratio=0.34"]


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(env_corpus(["frozen_lake"], 6), 320)


def tiny_model(tokenizer, seed=0):
    return build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                            intermediate_size=64, max_positions=2048, seed=seed).eval()


def fresh_learner(tokenizer):
    model = tiny_model(tokenizer)
    critic = build_critic(model).eval()
    return Learner(Policy(model, tokenizer), critic, None, torch.optim.AdamW(model.parameters(), lr=1e-3),
                   torch.optim.AdamW(critic.parameters(), lr=1e-3))


def test_groups_share_seeds_and_seeds_advance_each_step():
    cfg = load_config(None, CFG)
    pool = list(range(100, 110))
    step0, step1 = step_specs(cfg, pool, 0), step_specs(cfg, pool, 1)
    assert [s.seed for s in step0] == [100] * 4 + [101] * 4 + [102] * 4
    assert [s.group_id for s in step0] == [0] * 4 + [1] * 4 + [2] * 4
    assert [s.seed for s in step1] == [103] * 4 + [104] * 4 + [105] * 4
    assert [s.seed for s in step_specs(cfg, pool, 3)][::4] == [109, 100, 101]  # wraps around the pool


def test_group_members_see_the_same_start(tokenizer):
    cfg = load_config(None, CFG)
    trajectories = collect(cfg, fresh_learner(tokenizer).policy, list(range(100, 110)), 0)
    for group in range(3):
        states = {t.turns[0].state for t in trajectories if t.group_id == group}
        assert len(states) == 1
        assert states == {make_env("frozen_lake").reset(seed=100 + group)[0]}


def test_select_keeps_whole_groups(tokenizer):
    cfg = load_config(None, CFG)
    trajectories = collect(cfg, fresh_learner(tokenizer).policy, list(range(100, 110)), 0)
    kept, scores, metrics = select(cfg, trajectories)
    assert len(kept) == 4 and len({t.group_id for t in kept}) == 1 and len(scores) == 4
    assert metrics["filter/kept_frac"] == pytest.approx(1 / 3)


def test_select_best_success_keeps_each_groups_best_success(tokenizer):
    cfg = load_config(None, CFG + ["preset=rft"])
    played = collect(cfg, fresh_learner(tokenizer).policy, list(range(100, 110)), 0)  # the random model never wins
    # outcomes by hand (group 0: two wins, the 2-action one is best; group 1: none; group 2: one win)
    outcomes = [(1, 3), (0, 1), (1, 2), (0, 4), (0, 1), (0, 2), (0, 3), (0, 5), (0, 2), (0, 1), (1, 4), (0, 3)]
    trajectories = [replace(t, success=bool(won), env_return=float(won), num_actions=actions)
                    for t, (won, actions) in zip(played, outcomes)]
    kept, _, metrics = select(cfg, trajectories)
    assert kept == [trajectories[2], trajectories[10]]
    assert metrics["filter/kept_frac"] == pytest.approx(2 / 12)
    assert select(cfg, kept, already_filtered=True)[0] == kept  # step 1 reads the stage filter's output: unchanged
    # grpo_best: the same best successes score 1, the rest of their groups 0; group-normalised (mean 1/4, unbiased
    # std 1/2); group 1, all 0, is dropped
    kept, scores, _ = select(load_config(None, CFG + ["preset=grpo_best"]), trajectories)
    assert kept == trajectories[:4] + trajectories[8:]
    assert scores.tolist() == pytest.approx([-0.5, -0.5, 1.5, -0.5] * 2, abs=1e-5)


def test_select_normalises_over_the_batch_and_step_one_reads_the_stored_scores(tokenizer):
    cfg = load_config(None, CFG + ["algo.reward_norm=mean", "algo.reward_norm_grouping=batch"])
    played = collect(cfg, fresh_learner(tokenizer).policy, list(range(100, 110)), 0)
    # returns by hand: group 0 spreads 0..3, group 1 all 0, group 2 one return of 6; batch mean 1
    returns = [0, 1, 2, 3, 0, 0, 0, 0, 6, 0, 0, 0]
    trajectories = [replace(t, env_return=float(r), penalty=0.0) for t, r in zip(played, returns)]
    kept, scores, _ = select(cfg, trajectories)
    assert kept == trajectories[8:]  # group 2 has the largest spread (filter.keep_ratio keeps one group of three)
    assert scores.tolist() == [5.0, -1.0, -1.0, -1.0]  # centred on the batch's mean, not on the group's (1.5)
    # stage filter stores those scores; normalising the kept group alone again would centre it on 1.5
    assert select(cfg, kept, already_filtered=True, scores=scores.tolist())[1].tolist() == scores.tolist()
    with pytest.raises(ValueError, match="rerun stage filter"):
        select(cfg, kept, already_filtered=True)
    state = load_config(None, CFG + ["algo.reward_norm=mean"])
    assert select(state, trajectories)[1].tolist() == [4.5, -1.5, -1.5, -1.5]
    assert select(state, kept, already_filtered=True)[1].tolist() == [4.5, -1.5, -1.5, -1.5]


def test_a_step_without_a_success_skips_the_update(tokenizer):
    cfg = load_config(None, CFG + ["preset=rft", "train.groups=1", "train.group_size=2"])
    learner = fresh_learner(tokenizer)
    pool = [100]
    assert not any(t.success for t in collect(cfg, learner.policy, pool, 0))  # the same rollouts train_step plays
    before = [p.detach().clone() for p in learner.policy.model.parameters()]
    metrics = train_step(cfg, learner, pool, 0)
    assert metrics["actor/skipped_steps"] == 1 and metrics["filter/kept_frac"] == 0.0
    assert all(torch.equal(a, b) for a, b in zip(before, learner.policy.model.parameters()))


def test_same_seed_same_metrics_and_weights(tokenizer):
    cfg = load_config(None, CFG)
    runs = []
    for _ in range(2):
        learner = fresh_learner(tokenizer)
        metrics = [train_step(cfg, learner, list(range(100, 110)), step) for step in range(2)]
        runs.append(([{k: v for k, v in m.items() if not k.startswith(("timing/", "perf/"))} for m in metrics],
                     learner.policy.model.state_dict()))
    assert json.dumps(runs[0][0], sort_keys=True) == json.dumps(runs[1][0], sort_keys=True)  # NaN-safe
    assert all(torch.equal(runs[0][1][k], runs[1][1][k]) for k in runs[0][1])


def test_a_step_times_rollout_scoring_and_update_with_tokens_per_second(tokenizer):
    metrics = train_step(load_config(None, CFG), fresh_learner(tokenizer), list(range(100, 110)), 0)
    for phase in ("rollout", "score", "update"):
        assert metrics[f"timing/{phase}_s"] > 0, phase
        assert metrics[f"perf/{phase}_tokens_per_s"] > 0, phase


def test_step_one_logs_stage_filters_figures_and_no_rollout_timing(tokenizer):
    cfg = load_config(None, CFG)
    learner = fresh_learner(tokenizer)
    played = collect(cfg, learner.policy, list(range(100, 110)), 0)
    returns = [0, 1, 2, 3, 0, 0, 0, 0, 6, 0, 0, 0]  # by hand: group 2 has the widest spread, group 1 none
    whole = [replace(t, env_return=float(r), penalty=0.0) for t, r in zip(played, returns)]
    filtered, scores, _ = select(cfg, whole)  # what stage filter writes: one group of three
    metrics = train_step(cfg, learner, [], 0, first_batch=filtered, first_scores=scores.tolist(), first_rollout=whole)
    assert metrics["filter/kept_frac"] == pytest.approx(1 / 3)  # stage filter's, not 1 for the batch kept whole
    assert metrics["rollout/success_rate"] == pytest.approx(sum(t.success for t in whole) / 12)
    # nothing was rolled out in the step: no rollout time (it read ~0 s, and its tokens per second ~1e8)
    assert not {"timing/rollout_s", "perf/rollout_tokens_per_s"} & set(metrics)
    assert metrics["timing/update_s"] > 0 and metrics["perf/update_tokens_per_s"] > 0


def test_critic_warm_up_targets_are_the_returns_update_trains_on(tokenizer):
    # stage critic_fit batches the filtered rollouts as update's first step does: with reward_norm mean each
    # token's target is its trajectory's group-centred return, not the raw one
    cfg = load_config(None, [*CFG, "algo.reward_norm=mean"])
    policy = fresh_learner(tokenizer).policy
    trajectories = collect(cfg, policy, list(range(100, 110)), 0)
    kept, scores, _ = select(cfg, trajectories, already_filtered=True)
    assert len(kept) == 12
    raw = torch.tensor([t.traj_return for t in kept])
    groups = torch.tensor([t.group_id for t in kept])
    for g in range(3):
        assert torch.allclose(scores[groups == g], raw[groups == g] - raw[groups == g].mean())
    assert not torch.allclose(scores, raw)  # so the targets below tell centred from raw returns
    batch, targets = critic_batch(cfg, policy, kept, scores)
    for row in range(12):
        assert torch.allclose(targets[row][batch.loss_mask[row]], scores[row].expand(int(batch.loss_mask[row].sum())))
    # the warm-up itself: critic.warmup_epochs passes with an optimizer of its own, the loss falling, the policy
    # untouched (the critic is a copy with its own value head). The untrained policy's returns are format penalties,
    # equal within each group, so the raw ones (identity) are the targets to fit here
    cfg = load_config(None, [*CFG, "critic.warmup_epochs=4", "critic.lr=0.003"])
    batch, targets = critic_batch(cfg, policy, kept, raw)
    assert (targets[batch.loss_mask] < 0).all()
    critic = build_critic(policy.model)
    before = [p.detach().clone() for p in policy.model.parameters()]
    losses = warm_critic(cfg, critic, batch, targets)
    assert len(losses) == 4 and all(math.isfinite(x) for x in losses)
    assert losses[-1] < losses[0]
    assert all(torch.equal(b, p) for b, p in zip(before, policy.model.parameters()))


def test_reference_logprobs_run_the_shared_prompt_once_with_the_full_pass_values(tokenizer):
    # with a KL, make_batch scores the kept rows under the frozen reference; the rows' common prompt runs once
    cfg = load_config(None, [*CFG, "algo.kl=loss_k3", "algo.kl_coef=0.05", "filter.keep_ratio=1.0"])
    learner = replace(fresh_learner(tokenizer), ref=tiny_model(tokenizer, seed=1))
    kept, scores, _ = select(cfg, collect(cfg, learner.policy, list(range(100, 110)), 0))
    batch, ref_logprobs = make_batch(cfg, learner, kept, scores)
    lp = shareable_prefix(batch.input_ids, batch.attention_mask, batch.loss_mask)
    full, _ = score_sequences(learner.ref, batch.input_ids, batch.attention_mask, with_entropy=False)
    mask = batch.loss_mask
    assert torch.allclose(ref_logprobs[mask], full[mask], atol=1e-5)
    first = batch.attention_mask.int().argmax(1)  # (B,) each row's first real token (left padding)
    for row, start in enumerate(first.tolist()):  # the prefix ran once: its positions are not scored (0)
        assert lp > 0 and (ref_logprobs[row, start : start + lp] == 0).all()
        assert (full[row, start + 1 : start + lp] != 0).all()
    policy_lp, _ = score_sequences(learner.policy.model, batch.input_ids, batch.attention_mask, with_entropy=False)
    assert not torch.allclose(ref_logprobs[mask], policy_lp[mask])  # the reference's, not the policy's


def test_select_adds_the_first_action_bonus_before_normalising(tokenizer):
    collected = collect(load_config(None, CFG), fresh_learner(tokenizer).policy, list(range(100, 110)), 0)
    openings = ["Up", "Up", "Up", "Left"] + ["Down", "Left", "Left", "Right"] + ["Up", "Down", "Down", "Down"]
    played = [replace(t, turns=(replace(t.turns[0], actions=(a,)),) + t.turns[1:])
              for t, a in zip(collected, openings)]  # the random model parses no action in 10 tokens
    plain = ["filter.keep_ratio=1.0"]
    _, returns, _ = select(load_config(None, CFG + plain), played)
    for kind in ("entropy", "mi"):
        bonus = torch.tensor(first_action_bonus(played, kind))
        cfg = load_config(None, CFG + plain + [f"algo.first_action_bonus={kind}", "algo.first_action_coef=0.5"])
        kept, scores, metrics = select(cfg, played)
        assert bonus.std() > 0.1 and kept == played and torch.allclose(scores, returns + 0.5 * bonus)
        assert metrics["rollout/first_action_bonus"] == pytest.approx(float(bonus.mean()))
    # mean_std within each group: the bonus moves the scores, not only their level
    grpo = CFG + plain + ["algo.reward_norm=mean_std"]
    _, with_bonus, _ = select(load_config(None, grpo + ["algo.first_action_bonus=mi"]), played)
    _, without, _ = select(load_config(None, grpo), played)
    assert not torch.allclose(with_bonus, without)


def test_a_shaped_step_pays_each_turn_its_potential_gain(tokenizer):
    shaped = CFG + ["algo.shaping=solver", "algo.shaping_coef=2", "algo.reward_placement=turn",
                    "algo.advantage=bilevel_gae", "algo.turn_gamma=0"]
    cfg, pool = load_config(None, shaped), list(range(100, 110))
    learner = fresh_learner(tokenizer)
    trajectories = collect(cfg, learner.policy, pool, 0)
    unshaped = collect(load_config(None, CFG), learner.policy, pool, 0)
    assert [t.token_ids for t in trajectories] == [t.token_ids for t in unshaped]  # shaping is never shown
    for traj in trajectories:  # the turns' gains sum to c * (Phi(end) - Phi(start)), Phi(start) = W_{10,2}(start)
        env = make_env("frozen_lake")
        env.reset(seed=traj.seed)
        start = 2.0 * make_potential("solver", 1.0, 5)(env, env.max_actions_per_traj, 2)
        assert traj.shaping == pytest.approx(sum(t.shaping for t in traj.turns))
        assert traj.end_reason != "context"  # so the episode ended with no turn or action left, or on a terminal tile
        assert traj.shaping == pytest.approx(2.0 * float(traj.success) - start)  # Phi(end) = c * 1[goal]
    assert any(t.shaping != 0 for t in trajectories)
    kept, scores, _ = select(cfg, trajectories)
    batch = return_batch(cfg, learner.policy, kept, scores)
    assert batch.token_rewards.sum().item() == pytest.approx(sum(t.traj_return for t in kept), abs=1e-4)
    metrics = train_step(cfg, fresh_learner(tokenizer), pool, 0)
    assert metrics["rollout/shaping_mean"] == pytest.approx(sum(t.shaping for t in trajectories) / len(trajectories))
    assert all(v == v for k, v in metrics.items() if k.startswith(("actor/", "critic/")))  # finite, not NaN


KNOBS = {  # every value of the update's algorithm, filter, optimiser and sampling knobs (config choices, a few numbers)
    "train.env": ["bandit", "sokoban", "frozen_lake", "countdown"],
    "algo.advantage": ["gae", "bilevel_gae", "grpo", "rft"], "algo.grpo_by_std": ["true", "false"],
    "algo.gamma": ["1.0", "0.9"], "algo.lam": ["1.0", "0.95"],
    "algo.reward_norm": ["identity", "mean", "mean_std", "asym_clip"],
    "algo.reward_norm_grouping": ["state", "inductive", "batch"],
    "algo.kl": ["none", "reward_k1", "loss_k1", "loss_k3"], "algo.kl_coef": ["0.0", "0.05"],
    "algo.dual_clip": ["0.0", "3.0"], "algo.aggregation": ["token-mean", "seq-mean-token-mean"],
    "algo.loss_mask": ["assistant", "all"], "algo.old_logprobs": ["rescore", "sampler"],
    "algo.reward_placement": ["last", "turn"], "algo.outcome": ["return", "best_success"],
    "algo.first_action_bonus": ["none", "entropy", "mi"], "algo.shaping": ["none", "solver"],
    "algo.symmetry": ["none", "mirror", "flip", "rotate", "orbit"],
    "filter.mode": ["std", "std_rev", "nonzero", "top_p"], "filter.within": ["all", "best_success"],
    "filter.keep_ratio": ["1.0", "0.5", "0.25"], "train.ppo_epochs": ["1", "2"], "train.micro_batch_size": ["0", "3"],
    "rollout.max_episodes_per_pass": ["0", "5"],
}


RETURNS = [0, 1, 0, 1, 1, 1, 0, 0, 0, 0, 0, 1]  # three groups of four, each with a success and a spread


def test_random_combinations_of_the_knobs_train_or_are_refused_in_one_line():
    """Combinations of every knob above drawn by a fixed seed until 48 load: the others are refused by load_config
    with a ConfigError (one line naming the conflict), and each that loads trains two steps on a tiny policy with
    finite metrics (the critic's explained variance is NaN by definition when the returns are constant), the first
    updating the weights. Together the combinations that ran use every value of every knob."""
    tokenizer = train_tokenizer(env_corpus(["bandit", "sokoban", "frozen_lake", "countdown"], 4), 400)
    rng, ran, refused, updated = random.Random(0), [], 0, 0
    while len(ran) < 48:
        chosen = {key: rng.choice(values) for key, values in KNOBS.items()}
        try:
            cfg = load_config(None, CFG[1:] + [f"{k}={v}" for k, v in chosen.items()])
        except ConfigError as error:
            assert "\n" not in str(error) and str(error).split(":")[0].split()[0] in KNOBS, error
            refused += 1
            continue
        model = tiny_model(tokenizer)
        critic = build_critic(model).eval() if cfg.algo.advantage in ("gae", "bilevel_gae") else None
        learner = Learner(Policy(model, tokenizer), critic, tiny_model(tokenizer) if cfg.algo.kl != "none" else None,
                          torch.optim.AdamW(model.parameters(), lr=1e-3),
                          torch.optim.AdamW(critic.parameters(), lr=1e-3) if critic is not None else None)
        # step 1 as stage update plays it: the batch stage filter kept of the base's rollouts, here with returns
        # set by hand (an untrained policy fails every episode alike, so nothing would be kept or learned), then a
        # step of its own rollouts
        played = collect(cfg, learner.policy, list(range(100, 110)), 0)
        whole = [replace(t, env_return=float(r), penalty=0.0, success=bool(r)) for t, r in zip(played, RETURNS)]
        filtered, scores, _ = select(cfg, whole)
        first = train_step(cfg, learner, [], 0, first_batch=filtered, first_scores=scores.tolist(), first_rollout=whole)
        updated += first["actor/skipped_steps"] == 0.0
        metrics = train_step(cfg, learner, list(range(100, 110)), 1)
        for step in (first, metrics):
            assert all(math.isfinite(v) for k, v in step.items() if not k.startswith("critic/explained_var")), chosen
        ran.append(chosen)
    assert refused > 0 and updated == len(ran), (refused, updated)
    assert all({c[key] for c in ran} == set(values) for key, values in KNOBS.items()), \
        {key: set(values) - {c[key] for c in ran} for key, values in KNOBS.items()}
