"""A StarPO update on the small model: weights change, losses finite, non-finite gradients skip the step."""

from dataclasses import replace

import pytest
import torch

from ragen.advantages import compute_gae, whiten
from ragen.batching import build_batch
from ragen.config import RolloutConfig
from ragen.policy import Policy
from ragen.policy.model import build_critic, build_tiny_model
from ragen.policy.scoring import shareable_prefix, token_logprobs
from ragen.policy.tokenizer import env_corpus, train_tokenizer
from ragen.records import EpisodeSpec
from ragen.rollout import policy_responder, run_episodes
from ragen.update import UpdateSettings, fit_values, micro_batches, score_batch, update, uses_critic


@pytest.fixture(scope="module")
def setup():
    tokenizer = train_tokenizer(env_corpus(["bandit", "frozen_lake"], 6), 400)
    policy = Policy(small_model(tokenizer), tokenizer)
    cfg = RolloutConfig(max_new_tokens=10, max_turns=2)
    specs = [EpisodeSpec("frozen_lake", 50 + g, g) for g in range(2) for _ in range(4)]
    trajectories = run_episodes(specs, policy_responder(policy, cfg, generator=torch.Generator().manual_seed(0)),
                                policy.renderer(True), cfg, max_positions=2048)
    return policy, trajectories


def small_model(tokenizer):
    """A fresh one-layer policy, the same weights every call (seed 0)."""
    return build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                            intermediate_size=64, max_positions=2048, seed=0).eval()


def spread_batch(policy, trajectories, loss_mask="assistant"):
    """The rollouts as a batch whose returns get a spread (-1 .. 1) so the advantages are not all zero."""
    batch = build_batch(trajectories, pad_id=policy.tokenizer.pad_token_id, device=torch.device("cpu"),
                        loss_mask=loss_mask)
    spread = torch.linspace(-1, 1, len(trajectories))
    rewards = batch.token_rewards.clone()
    rewards[:, -1] += spread
    return replace(batch, token_rewards=rewards, traj_returns=batch.traj_returns + spread)


def settings(advantage="gae", **kw):
    base = dict(advantage=advantage, gamma=1.0, lam=1.0, turn_gamma=0.95, eps_low=0.2, eps_high=0.28, dual_clip=None,
                entropy_coef=0.001, kl_loss=None, kl_coef=0.0, value_clip=0.5, aggregation="token-mean",
                mini_batch_size=4, grad_clip=1.0)
    return UpdateSettings(**{**base, **kw})


@pytest.mark.parametrize("loss_mask,advantage", [("assistant", "gae"), ("all", "gae"), ("assistant", "bilevel_gae"),
                                                 ("all", "bilevel_gae")])
def test_two_ppo_steps_change_the_weights(setup, loss_mask, advantage):
    policy, trajectories = setup
    model = small_model(policy.tokenizer)
    critic = build_critic(model)
    batch = spread_batch(policy, trajectories, loss_mask)
    before, critic_before = [p.detach().clone() for p in model.parameters()], critic.score.weight.detach().clone()
    actor_opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    critic_opt = torch.optim.AdamW(critic.parameters(), lr=1e-3)
    for _ in range(2):
        stats = update(model, critic, actor_opt, critic_opt, batch, settings(advantage))
        assert all(torch.isfinite(torch.tensor(v)) for k, v in stats.items() if not k.startswith("critic/explained"))
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert not torch.equal(critic_before, critic.score.weight)
    assert stats["actor/skipped_steps"] == 0
    assert {"actor/pg_loss", "actor/clipfrac_high", "actor/clipfrac_low", "actor/approx_kl", "actor/entropy",
            "actor/grad_norm", "critic/value_loss", "critic/explained_var",
            "critic/explained_var_group_mean"} <= set(stats)


def test_rft_update_makes_the_kept_episodes_more_likely(setup):
    policy, trajectories = setup
    model = small_model(policy.tokenizer)
    batch = build_batch(trajectories[:4], pad_id=policy.tokenizer.pad_token_id, device=torch.device("cpu"))
    assert not uses_critic("rft")

    def loglik():
        with torch.no_grad():
            return (token_logprobs(model, batch.input_ids, batch.attention_mask)[0] * batch.loss_mask).sum(dim=1)

    before = loglik()  # (4,)
    stats = update(model, None, torch.optim.AdamW(model.parameters(), lr=1e-3), None, batch, settings("rft"))
    assert stats["actor/advantage_mean"] == 1.0 and stats["actor/skipped_steps"] == 0
    assert (loglik() > before).all()


def test_a_second_epoch_steps_again_from_the_same_old_logprobs(setup):
    policy, trajectories = setup
    batch = spread_batch(policy, trajectories)
    runs = {}
    for epochs in (1, 2):
        model = small_model(policy.tokenizer)
        stats = update(model, None, torch.optim.AdamW(model.parameters(), lr=1e-2), None, batch,
                       settings("grpo", mini_batch_size=8, epochs=epochs))
        runs[epochs] = stats, [p.detach().clone() for p in model.parameters()]
    # one mini-batch: the only step of epoch 1 sees ratio 1; epoch 2 sees the moved policy against the same old
    assert abs(runs[1][0]["actor/approx_kl"]) < 1e-6 < abs(runs[2][0]["actor/approx_kl"])
    assert any(not torch.equal(a, b) for a, b in zip(runs[1][1], runs[2][1]))


def test_the_update_passes_run_without_dropout(setup):
    """A model with dropout (GPT-2 has 0.1; here 0.5 in the attention) that is handed over in train mode: the first
    mini-batch's ratio is still exactly 1 (no approx_kl, nothing clipped), and its critic's too (no value clip)."""
    policy, trajectories = setup
    batch = spread_batch(policy, trajectories)
    model = small_model(policy.tokenizer)
    critic = build_critic(model)
    torch.nn.init.normal_(critic.score.weight, std=0.1)  # values that dropout could move
    for module in [*model.modules(), *critic.modules()]:
        if hasattr(module, "attention_dropout"):
            module.attention_dropout = 0.5
    model.train(), critic.train()
    stats = update(model, critic, torch.optim.AdamW(model.parameters(), lr=1e-2),
                   torch.optim.AdamW(critic.parameters(), lr=1e-2), batch, settings(mini_batch_size=8))
    assert abs(stats["actor/approx_kl"]) < 1e-6
    assert stats["actor/clipfrac_low"] == stats["actor/clipfrac_high"] == 0
    assert stats["critic/value_clipfrac"] == 0


def test_first_rescoring_matches_the_sampler(setup):
    policy, trajectories = setup
    model = small_model(policy.tokenizer)
    batch = build_batch(trajectories, pad_id=policy.tokenizer.pad_token_id, device=torch.device("cpu"))
    stats = update(model, None, torch.optim.SGD(model.parameters(), lr=0.0), None, batch, settings("grpo"))
    assert stats["actor/sampler_logprob_gap"] < 1e-4


def test_grpo_by_std_off_scores_centred_returns(setup):
    policy, trajectories = setup
    batch = spread_batch(policy, trajectories)
    model = small_model(policy.tokenizer)
    with_std = score_batch(model, None, batch, settings("grpo", old_logprobs="sampler")).advantages
    centred = score_batch(model, None, batch, settings("grpo", old_logprobs="sampler", grpo_by_std=False)).advantages
    for g in batch.group_ids.unique():
        rows = batch.group_ids == g
        r = batch.traj_returns[rows]
        expected = (r - r.mean())[:, None] * batch.loss_mask[rows]  # (n, T)
        assert torch.allclose(centred[rows], expected, atol=1e-5)
        if r.std() > 1e-3:  # the default divides the same centred returns by the group's std
            assert torch.allclose(with_std[rows], expected / (r.std() + 1e-6), atol=1e-4)


def test_sampler_logprobs_skip_the_rescoring_pass_and_train_the_same(setup):
    """old_logprobs=sampler reads log pi_old from the rollout (no policy forward pass before the first step) and,
    the sampler being the same policy on the same ids, takes the same optimizer steps up to float error."""
    policy, trajectories = setup
    batch = spread_batch(policy, trajectories)
    runs = {}
    for mode in ("rescore", "sampler"):
        model = small_model(policy.tokenizer)
        calls = []
        hook = model.register_forward_hook(lambda *_: calls.append(torch.is_grad_enabled()))
        scored = score_batch(model, None, batch, settings("grpo", old_logprobs=mode))
        no_grad_calls = calls.count(False)
        stats = update(model, None, torch.optim.AdamW(model.parameters(), lr=1e-2), None, batch,
                       settings("grpo", old_logprobs=mode), scored=scored)
        hook.remove()
        runs[mode] = scored, no_grad_calls, stats, [p.detach().clone() for p in model.parameters()]
    (rescored, rescore_calls, rescore_stats, rescore_weights) = runs["rescore"]
    (sampled, sampler_calls, sampler_stats, sampler_weights) = runs["sampler"]
    assert rescore_calls >= 1 and sampler_calls == 0
    assert torch.equal(sampled.old_logprobs, batch.sampled_logprobs) and sampled.sampler_gap is None
    mask = batch.loss_mask
    assert (rescored.old_logprobs - sampled.old_logprobs)[mask].abs().max() < 1e-4
    assert torch.equal(rescored.advantages, sampled.advantages)
    assert "actor/sampler_logprob_gap" in rescore_stats and "actor/sampler_logprob_gap" not in sampler_stats
    assert abs(rescore_stats["actor/pg_loss"] - sampler_stats["actor/pg_loss"]) < 1e-4
    assert all(torch.allclose(a, b, atol=1e-4) for a, b in zip(rescore_weights, sampler_weights))
    assert any(not torch.equal(a, b) for a, b in zip(rescore_weights, [p.detach() for p in small_model(
        policy.tokenizer).parameters()]))  # it did train


def test_scoring_the_batch_apart_gives_the_same_update(setup):
    """The training loop runs `score_batch` itself (to time scoring apart from the update) and passes it in: the
    same metrics and weights as an update that scores the batch itself."""
    policy, trajectories = setup
    batch = spread_batch(policy, trajectories)
    runs = []
    for apart in (False, True):
        model = small_model(policy.tokenizer)
        critic = build_critic(model)
        actor_opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        critic_opt = torch.optim.AdamW(critic.parameters(), lr=1e-3)
        scored = score_batch(model, critic, batch, settings()) if apart else None
        if apart:  # (B, T) each
            assert scored.old_logprobs.shape == scored.advantages.shape == scored.returns.shape == batch.loss_mask.shape
        stats = update(model, critic, actor_opt, critic_opt, batch, settings(), scored=scored)
        runs.append((stats, [p.detach() for p in (*model.parameters(), *critic.parameters())]))
    (stats, weights), (apart_stats, apart_weights) = runs
    assert stats == apart_stats
    assert all(torch.equal(a, b) for a, b in zip(weights, apart_weights))


def test_a_kl_in_the_reward_is_folded_in_before_the_advantages(setup):
    # reward_k1: r_t <- r_t - beta * (log pi_old - log pi_ref) on trained tokens, then GAE (gamma = lam = 1), whitened
    policy, trajectories = setup
    model, beta = small_model(policy.tokenizer), 0.5
    ref = build_tiny_model(policy.tokenizer, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                           intermediate_size=64, max_positions=2048, seed=1).eval()
    critic = build_critic(model)
    batch = spread_batch(policy, trajectories)
    with torch.no_grad():
        ref_logprobs, _ = token_logprobs(ref, batch.input_ids, batch.attention_mask)
    folded = score_batch(model, critic, batch, settings(kl_reward_coef=beta), ref_logprobs=ref_logprobs)
    plain = score_batch(model, critic, batch, settings(), ref_logprobs=ref_logprobs)  # beta 0: nothing folded
    rewards = batch.token_rewards - beta * (folded.old_logprobs - ref_logprobs) * batch.loss_mask
    expected, _ = compute_gae(rewards, folded.old_values, batch.loss_mask, gamma=1.0, lam=1.0)
    assert torch.allclose(folded.advantages, whiten(expected, batch.loss_mask), atol=1e-5)
    assert not torch.allclose(folded.advantages, plain.advantages, atol=1e-3)


@pytest.mark.parametrize("advantage", ["gae", "bilevel_gae"])
def test_critic_advantages_without_a_critic_say_so(setup, advantage):
    policy, trajectories = setup
    assert uses_critic(advantage) and not uses_critic("grpo")
    batch = build_batch(trajectories, pad_id=policy.tokenizer.pad_token_id, device=torch.device("cpu"))
    with pytest.raises(ValueError, match=f"{advantage} reads critic values"):
        update(policy.model, None, torch.optim.SGD(policy.model.parameters(), lr=0.0), None, batch, settings(advantage))
    with pytest.raises(ValueError, match=f"{advantage} reads critic values; pass a critic"):
        score_batch(policy.model, None, batch, settings(advantage))
    with pytest.raises(ValueError, match="unknown algo.advantage 'gea'"):
        uses_critic("gea")


def test_non_finite_gradient_skips_the_step(setup):
    policy, trajectories = setup
    model = small_model(policy.tokenizer)
    batch = build_batch(trajectories, pad_id=policy.tokenizer.pad_token_id, device=torch.device("cpu"))
    batch = replace(batch, traj_returns=batch.traj_returns + torch.tensor([float("inf")] + [0.0] * 7))
    before = [p.detach().clone() for p in model.parameters()]
    stats = update(model, None, torch.optim.AdamW(model.parameters(), lr=1e-3), None, batch, settings("grpo", mini_batch_size=8))
    assert stats["actor/skipped_steps"] == 1
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


@pytest.mark.parametrize("loss_mask", ["assistant", "all"])
def test_sharing_the_prompt_prefix_changes_no_metric_and_no_weight(setup, loss_mask):
    """The update runs the rows' common prompt prefix once (`share_prefix`); two steps give what running every row
    whole gives: the same metrics and the same weights, to float rounding (a clip fraction may differ by a token
    that sits on the clip boundary)."""
    policy, trajectories = setup
    batch = spread_batch(policy, trajectories, loss_mask)
    assert shareable_prefix(batch.input_ids, batch.attention_mask, batch.loss_mask) > 0  # there is a prefix to share
    runs = {}
    for share in (True, False):
        model = small_model(policy.tokenizer)
        critic = build_critic(model)
        actor_opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        critic_opt = torch.optim.AdamW(critic.parameters(), lr=1e-3)
        stats = [update(model, critic, actor_opt, critic_opt, batch, settings(share_prefix=share)) for _ in range(2)]
        runs[share] = stats, [p.detach() for p in (*model.parameters(), *critic.parameters())]
    (shared_stats, shared_weights), (full_stats, full_weights) = runs[True], runs[False]
    for shared, full in zip(shared_stats, full_stats):
        assert shared.keys() == full.keys()
        for key in shared:
            assert shared[key] == pytest.approx(full[key], rel=1e-4, abs=2e-3 if "clipfrac" in key else 1e-5), key
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(shared_weights, full_weights))


def sequence_logprob(model, batch) -> torch.Tensor:
    """(B,) sum of log pi over each row's trained tokens."""
    with torch.no_grad():
        logprobs, _ = token_logprobs(model, batch.input_ids, batch.attention_mask)
    return (logprobs * batch.loss_mask).sum(-1)


@pytest.mark.parametrize("advantage", ["gae", "bilevel_gae", "grpo"])
def test_an_update_favours_the_rollouts_that_scored_higher(setup, advantage):
    """The sign of the whole chain (returns -> advantages -> clipped loss -> optimizer step): after one update, the
    rollout with the higher return in each group of 4 is more likely and the lowest one less likely."""
    policy, trajectories = setup
    model = small_model(policy.tokenizer)
    critic = build_critic(model) if advantage != "grpo" else None  # value head starts at 0: A = R - 0
    batch = build_batch(trajectories, pad_id=policy.tokenizer.pad_token_id, device=torch.device("cpu"))
    returns = torch.tensor([1.0, 0.0, 0.0, -1.0] * 2)  # two groups of 4 (group ids 0 0 0 0 1 1 1 1)
    assert batch.group_ids.tolist() == [0] * 4 + [1] * 4
    rewards = torch.zeros_like(batch.token_rewards)
    rewards[:, -1] = returns
    batch = replace(batch, token_rewards=rewards, traj_returns=returns)
    before = sequence_logprob(model, batch)
    critic_opt = torch.optim.AdamW(critic.parameters(), lr=1e-3) if critic is not None else None
    update(model, critic, torch.optim.SGD(model.parameters(), lr=0.5), critic_opt, batch,
           settings(advantage, mini_batch_size=8, entropy_coef=0.0))
    change = sequence_logprob(model, batch) - before  # (B,)
    assert change[0] > 0 and change[4] > 0, change  # the best of each group gained likelihood
    assert change[3] < 0 and change[7] < 0, change  # the worst lost it
    assert change[0] - change[3] > 0 and change[4] - change[7] > 0


def test_critic_epochs_give_the_critic_more_passes_than_the_actor(setup):
    """critic_epochs 3, epochs 1, mini-batches of 4 over 8 trajectories: the critic takes 2 x 3 optimizer steps,
    the actor 2, and the actor's steps are those of a one-pass update (the critic's extra passes run after them
    and the advantages were scored before any step)."""
    policy, trajectories = setup
    batch = spread_batch(policy, trajectories)
    runs = {}
    for critic_epochs in (0, 3):
        model = small_model(policy.tokenizer)
        critic = build_critic(model)
        actor_opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        critic_opt = torch.optim.AdamW(critic.parameters(), lr=1e-3)
        update(model, critic, actor_opt, critic_opt, batch, settings(critic_epochs=critic_epochs))
        steps = {name: int(next(iter(opt.state.values()))["step"]) for name, opt in
                 (("actor", actor_opt), ("critic", critic_opt))}
        runs[critic_epochs] = steps, [p.detach().clone() for p in model.parameters()], critic.score.weight.clone()
    assert runs[0][0] == {"actor": 2, "critic": 2}
    assert runs[3][0] == {"actor": 2, "critic": 6}
    assert all(torch.equal(a, b) for a, b in zip(runs[0][1], runs[3][1]))
    assert not torch.equal(runs[0][2], runs[3][2])


def test_fit_values_regresses_the_critic_onto_fixed_targets(setup):
    """The warm-up's first loss is that of a zero value head, 0.5 * mean of G^2 over the masked tokens (one
    mini-batch over all 8 rows); later passes lower it; no pass, no step."""
    policy, trajectories = setup
    batch = spread_batch(policy, trajectories)
    targets = torch.linspace(-1, 1, len(trajectories))[:, None] * batch.loss_mask  # (B, T)
    critic = build_critic(small_model(policy.tokenizer))
    optimizer = torch.optim.AdamW(critic.parameters(), lr=1e-2)
    assert fit_values(critic, optimizer, batch, targets, epochs=0, mini_batch_size=8, grad_clip=1.0) == []
    assert not optimizer.state
    losses = fit_values(critic, optimizer, batch, targets, epochs=5, mini_batch_size=8, grad_clip=1.0)
    m = batch.loss_mask.float()
    assert losses[0] == pytest.approx(float(0.5 * (targets ** 2 * m).sum() / m.sum()), rel=1e-5)
    assert len(losses) == 5 and losses[-1] < 0.7 * losses[0]
    assert not critic.training and int(next(iter(optimizer.state.values()))["step"]) == 5


def test_micro_batches_by_hand():
    """Longest rows first (ties in row order), each pass filled while it holds at most max_rows rows and at most
    max_tokens = rows x its longest row; no limit: one pass in row order."""
    lengths = torch.tensor([3, 7, 5, 7, 2, 4])

    def passes(start=0, stop=6, **limits):
        return [p.tolist() for p in micro_batches(lengths, start, stop, **limits)]

    assert passes() == [[0, 1, 2, 3, 4, 5]]
    assert passes(max_rows=2) == [[1, 3], [2, 5], [0, 4]]
    assert passes(max_tokens=12) == [[1], [3], [2, 5], [0, 4]]  # 2 x 7 > 12; 2 x 5 <= 12 < 3 x 5; 2 x 3
    assert passes(max_tokens=5) == [[1], [3], [2], [5], [0], [4]]  # a row longer than the limit runs alone
    assert passes(max_rows=2, max_tokens=20) == [[1, 3], [2, 5], [0, 4]]
    assert passes(max_tokens=100) == [[1, 3, 2, 5, 0, 4]]  # one pass, in order of length
    assert passes(2, 6, max_rows=2) == [[3, 2], [5, 4]]  # rows of one mini-batch only


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean"])
def test_micro_batches_accumulate_to_the_mini_batch_update(setup, aggregation):
    """Gradient accumulation over micro-batches (`micro_batch_size`: 1, and 3 + 1 rows of each mini-batch of 4;
    `micro_batch_tokens`: passes of one to several rows by length) gives the update of one pass over the mini-batch:
    the same weights of actor and critic and the same metrics after two steps with the critic and a KL loss, to
    float rounding; only the memory of a pass changes."""
    policy, trajectories = setup
    batch = spread_batch(policy, trajectories)
    ref = small_model(policy.tokenizer)
    with torch.no_grad():
        ref.model.embed_tokens.weight.mul_(1.1)  # a reference the policy differs from, so the KL term is not 0
    ref_logprobs = token_logprobs(ref, batch.input_ids, batch.attention_mask)[0].detach()
    lengths = batch.attention_mask.sum(-1)
    budget = int(lengths.max()) * 2  # the longest rows alone or in pairs, shorter ones packed
    passes = micro_batches(lengths, 0, 4, max_tokens=budget) + micro_batches(lengths, 4, 8, max_tokens=budget)
    assert len(passes) > 2 and any(len(p) > 1 for p in passes) and lengths.min() < lengths.max()
    limits = {"whole": {}, "rows 1": {"micro_batch_size": 1}, "rows 3": {"micro_batch_size": 3},
              "tokens": {"micro_batch_tokens": budget}}
    runs = {}
    for name, limit in limits.items():
        model = small_model(policy.tokenizer)
        critic = build_critic(model)
        actor_opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        critic_opt = torch.optim.AdamW(critic.parameters(), lr=1e-3)
        s = settings(aggregation=aggregation, kl_loss="k3", kl_coef=0.1, **limit)
        stats = [update(model, critic, actor_opt, critic_opt, batch, s, ref_logprobs=ref_logprobs) for _ in range(2)]
        runs[name] = stats, [p.detach() for p in (*model.parameters(), *critic.parameters())]
    whole_stats, whole_weights = runs["whole"]
    assert whole_stats[1]["actor/kl_loss"] > 1e-4
    for micro in ("rows 1", "rows 3", "tokens"):
        stats, weights = runs[micro]
        for one, whole in zip(stats, whole_stats):
            assert one.keys() == whole.keys()
            for key in whole:
                assert one[key] == pytest.approx(whole[key], rel=1e-4, abs=2e-3 if "clipfrac" in key else 1e-5), key
        assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(weights, whole_weights)), micro


def test_fit_values_in_micro_batches_fits_as_in_one_pass(setup):
    policy, trajectories = setup
    batch = spread_batch(policy, trajectories)
    targets = torch.linspace(-1, 1, len(trajectories))[:, None] * batch.loss_mask  # (B, T)
    runs = []
    for limits in ({}, {"micro_batch_size": 3}, {"micro_batch_tokens": int(batch.attention_mask.sum(-1).max()) * 3}):
        critic = build_critic(small_model(policy.tokenizer))
        optimizer = torch.optim.AdamW(critic.parameters(), lr=1e-2)
        losses = fit_values(critic, optimizer, batch, targets, epochs=3, mini_batch_size=8, grad_clip=1.0, **limits)
        runs.append((losses, [p.detach() for p in critic.parameters()]))
    (whole_losses, whole_weights), *others = runs
    for losses, weights in others:
        assert losses == pytest.approx(whole_losses, rel=1e-5)
        assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(weights, whole_weights))


def test_a_non_finite_micro_batch_skips_the_whole_step(setup):
    policy, trajectories = setup
    model = small_model(policy.tokenizer)
    batch = build_batch(trajectories, pad_id=policy.tokenizer.pad_token_id, device=torch.device("cpu"))
    batch = replace(batch, traj_returns=batch.traj_returns + torch.tensor([0.0] * 7 + [float("inf")]))
    before = [p.detach().clone() for p in model.parameters()]
    stats = update(model, None, torch.optim.AdamW(model.parameters(), lr=1e-3), None, batch,
                   settings("grpo", mini_batch_size=8, micro_batch_size=2))
    assert stats["actor/skipped_steps"] == 1
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
