"""Multi-turn rollout: one exact token sequence per episode, masks, penalties, budgets and endings."""

from dataclasses import replace

import pytest
import torch

from chat_templates import THINK_STRIPPING, gemma3_style, llama3_style, llama3_text
from ragen.config import RolloutConfig
from ragen.envs import make_env
from ragen.policy.sampling import Sample
from ragen.policy.tokenizer import env_corpus, train_tokenizer
from ragen.prompting import SYSTEM_PROMPT, first_user_message, next_user_message
from ragen.records import EpisodeSpec
from ragen.rollout import policy_responder, run_episodes, summarize
from ragen.policy import Policy
from ragen.policy.chat import ChatRenderer, ChatTemplateError
from ragen.policy.model import build_tiny_model

LAYOUT = "######\n#P_XO#\n######"  # two Rights push the box home after one walk


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(env_corpus(["bandit", "sokoban", "frozen_lake"], episodes_per_env=6), vocab_size=400)


def scripted(tokenizer, responses):
    """A responder that answers turn k of every episode with responses[k] (text after the forced prefix)."""
    calls = []

    def respond(prompts, envs):
        text = responses[len(calls)]
        calls.append(text)
        ids = tokenizer.encode(text, add_special_tokens=False)
        return [Sample(tuple(ids), (-0.5,) * len(ids), "stop") for _ in prompts]

    return respond


def play(tokenizer, responses, spec=EpisodeSpec("sokoban", 4), cfg=RolloutConfig(), max_positions=4096):
    renderer = ChatRenderer(tokenizer, "<think>")
    return run_episodes([spec], scripted(tokenizer, responses), renderer, cfg, max_positions=max_positions)[0]


def conversation(traj, spec=EpisodeSpec("sokoban", 4)):
    """The chat messages of a played episode, rebuilt from the env and the recorded turns."""
    env = make_env(spec.tag)
    env.reset(seed=spec.seed)
    messages = [{"role": "system", "content": SYSTEM_PROMPT}]
    left = env.max_actions_per_traj
    for k, turn in enumerate(traj.turns, start=1):
        user = first_user_message(env, turn.state, left, True) if k == 1 else next_user_message(
            traj.turns[k - 2].reward, k, turn.state, left, True)
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": "<think>" + turn.response}]
        left -= turn.executed
    return messages


def test_sequence_is_the_chat_template_of_the_conversation(tokenizer):
    responses = ["I go.</think><answer>Up || Left</answer>", "oops no tags", "ok</think><answer>Down</answer>",
                 "x</think><answer>Right</answer>", "y</think><answer>Left</answer>"]
    traj = play(tokenizer, responses)
    assert tokenizer.decode(traj.token_ids) == tokenizer.apply_chat_template(conversation(traj), tokenize=False)
    assert len(traj.turns) == 5 and traj.end_reason == "turns"


def test_a_trimming_template_whose_turns_end_in_their_own_token():
    """Llama 3's template: content trimmed, turns closed by <|eot_id|>, which is not the tokenizer's eos. A response
    ending in whitespace keeps it (the sampled ids), and one the model ended with <|eot_id|> is not closed twice."""
    tok = llama3_style(train_tokenizer(env_corpus(["sokoban"], episodes_per_env=6), vocab_size=400))
    eot = tok.convert_tokens_to_ids("<|eot_id|>")
    script = [("I go.</think><answer>Up</answer>\n\n", "stop"), ("then</think><answer>Left</answer>", "eos"),
              ("x</think><answer>Down</answer> ", "length")]

    def respond(prompts, envs):
        text, finish = script[len(calls)]
        calls.append(text)
        ids = tok.encode(text, add_special_tokens=False) + ([eot] if finish == "eos" else [])
        return [Sample(tuple(ids), (-0.5,) * len(ids), finish) for _ in prompts]

    calls = []
    traj = run_episodes([EpisodeSpec("sokoban", 4)], respond, ChatRenderer(tok, "<think>"),
                        RolloutConfig(max_turns=3), max_positions=4096)[0]
    assert [t.response for t in traj.turns] == [text for text, _ in script]
    assert tok.decode(traj.token_ids) == llama3_text(conversation(traj))
    assert tok.decode(traj.token_ids).count("<|eot_id|>") == 7  # system, three users, three responses
    masked = [t for t, m in zip(traj.token_ids, traj.sampled_mask) if m]
    assert masked == [t for turn in traj.turns for t in turn.response_ids]
    assert tok.decode(traj.token_ids[: traj.system_len]) == llama3_text(conversation(traj)[:1])


def test_a_template_that_folds_the_system_message_into_the_first_user_turn():
    """Gemma 3's template has no system turn: the system message is the first user turn's text up to the end of
    the system prompt, and the episode is still the template's rendering of the conversation."""
    tok = gemma3_style(train_tokenizer(env_corpus(["sokoban"], episodes_per_env=6), vocab_size=400))
    traj = run_episodes([EpisodeSpec("sokoban", 4)], scripted(tok, ["a</think><answer>Up</answer>"] * 2),
                        ChatRenderer(tok, "<think>"), RolloutConfig(max_turns=2), max_positions=4096)[0]
    assert tok.decode(traj.token_ids) == tok.apply_chat_template(conversation(traj), tokenize=False)
    assert tok.decode(traj.token_ids[: traj.system_len]) == f"<bos><start_of_turn>user\n{SYSTEM_PROMPT.strip()}"
    assert not any(traj.sampled_mask[: traj.system_len]) and len(traj.turns) == 2


def test_a_template_that_rewrites_earlier_turns_is_refused(tokenizer):
    tok = __import__("copy").deepcopy(tokenizer)
    tok.chat_template = THINK_STRIPPING
    with pytest.raises(ChatTemplateError, match="prefix-stable"):
        run_episodes([EpisodeSpec("sokoban", 4)], scripted(tok, ["a</think><answer>Up</answer>"] * 2),
                     ChatRenderer(tok, "<think>"), RolloutConfig(max_turns=2), max_positions=4096)


def test_sampled_mask_covers_exactly_the_response_tokens(tokenizer):
    traj = play(tokenizer, ["a</think><answer>Up</answer>", "b</think><answer>Down || Left</answer>"] + ["c"] * 3)
    masked = [tok for tok, m in zip(traj.token_ids, traj.sampled_mask) if m]
    assert masked == [t for turn in traj.turns for t in turn.response_ids]
    assert [lp for lp, m in zip(traj.sampled_logprobs, traj.sampled_mask) if m] == [-0.5] * len(masked)
    assert all(lp == 0.0 for lp, m in zip(traj.sampled_logprobs, traj.sampled_mask) if not m)
    assert not any(traj.sampled_mask[: traj.system_len])
    for turn, end in zip(traj.turns, traj.turn_ends):
        assert traj.token_ids[end] == turn.response_ids[-1] and traj.sampled_mask[end]
    assert tokenizer.decode(traj.token_ids[: traj.system_len]) == f"<|im_start|>system\n{SYSTEM_PROMPT}<|im_end|>\n"


def test_penalties_budget_and_rewards(tokenizer):
    cfg = RolloutConfig(max_actions_per_turn=5)
    responses = [
        "no format at all",  # penalty, nothing executed
        "a</think><answer>Jump || Right</answer>",  # invalid name: penalty, Right still executed
        "b</think><answer>Right</answer>",  # pushes the box home: solved
    ]
    traj = play(tokenizer, responses, spec=EpisodeSpec("sokoban", 0, layout=LAYOUT), cfg=cfg)
    t1, t2, t3 = traj.turns
    assert (t1.penalty, t1.executed, t1.reward, t1.format_ok) == (-0.1, 0, 0.0, False)
    assert (t2.penalty, t2.executed, t2.format_ok, t2.actions_valid) == (-0.1, 1, True, False)
    assert t2.reward == pytest.approx(-0.1)
    assert (t3.penalty, t3.executed) == (0.0, 1) and t3.reward == pytest.approx(10.9)
    assert traj.success and traj.end_reason == "terminated"
    assert traj.env_return == pytest.approx(10.8) and traj.traj_return == pytest.approx(10.6)
    # the next user message shows the env reward only, never the penalty
    text = tokenizer.decode(traj.token_ids)
    assert "Reward:\n0.0\n\nTurn 2:" in text and "Reward:\n-0.1\n\nTurn 3:" in text


def test_actions_over_the_budget_are_dropped_without_penalty(tokenizer):
    many = "x</think><answer>" + " || ".join(["Up"] * 5) + "</answer>"
    traj = play(tokenizer, [many, many, many], cfg=RolloutConfig(max_actions_per_turn=5))
    assert [t.executed for t in traj.turns] == [5, 5]
    assert all(t.penalty == 0.0 for t in traj.turns)
    assert traj.num_actions == 10 and traj.end_reason == "budget"


def test_effective_actions_and_pass_at_n(tokenizer):
    # Up and Down walk into the walls (valid, no effect); Right walks, the next Right pushes the box home
    responses = ["a</think><answer>Up || Right || Down</answer>", "b</think><answer>Right</answer>"]
    traj = play(tokenizer, responses, spec=EpisodeSpec("sokoban", 0, layout=LAYOUT),
                cfg=RolloutConfig(max_actions_per_turn=5))
    assert [(t.executed, t.effective) for t in traj.turns] == [(3, 1), (1, 1)] and traj.success
    assert summarize([traj])["effective_action_rate"] == pytest.approx(2 / 4)
    # pass@N: a group is one start (tag and group_id); it passes when any of its rollouts succeeds
    won, lost = traj, replace(traj, success=False)
    batch = [replace(won, group_id=0), replace(lost, group_id=0), replace(lost, group_id=1), replace(lost, group_id=1),
             replace(lost, tag="frozen_lake", group_id=0), replace(won, tag="frozen_lake", group_id=0)]
    stats = summarize(batch)
    assert stats["pass_at_n"] == pytest.approx(2 / 3) and stats["success_rate"] == pytest.approx(2 / 6)
    assert summarize([])["effective_action_rate"] == 0.0


def test_more_turns_than_ragens_five_are_played(tokenizer):
    """rollout.max_turns is the turn limit of a multi-turn env (it was capped at RAGEN's 5 before 2026-12-05)."""
    one = ["x</think><answer>Up</answer>"] * 12
    traj = play(tokenizer, one, cfg=RolloutConfig(max_turns=7))
    assert len(traj.turns) == 7 and traj.end_reason == "turns" and traj.num_actions == 7
    traj = play(tokenizer, one, cfg=RolloutConfig(max_turns=12))
    assert len(traj.turns) == 10 and traj.end_reason == "budget"  # Sokoban's 10 actions run out first
    assert "You have 1 actions left" in tokenizer.decode(traj.token_ids)


def test_single_turn_envs_end_after_one_turn(tokenizer):
    traj = play(tokenizer, ["x</think><answer>Nope</answer>"] * 5, spec=EpisodeSpec("bandit", 3))
    assert len(traj.turns) == 1 and traj.end_reason == "turns" and traj.penalty == -0.1 and not traj.success


def test_context_limit_closes_the_episode(tokenizer):
    traj = play(tokenizer, ["x</think><answer>Up</answer>"] * 5, max_positions=400)
    assert traj.end_reason == "context" and len(traj.token_ids) + RolloutConfig().max_new_tokens <= 400 + 200
    assert tokenizer.decode(traj.token_ids).endswith("<|im_end|>\n")


def test_policy_rollouts_are_deterministic_by_seed(tokenizer):
    model = build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                             intermediate_size=64, max_positions=2048, seed=0)
    policy = Policy(model.eval(), tokenizer)
    specs = [EpisodeSpec("frozen_lake", 7, 0), EpisodeSpec("frozen_lake", 7, 0), EpisodeSpec("bandit", 8, 1)]
    cfg = RolloutConfig(max_new_tokens=12)
    runs = [run_episodes(specs, policy_responder(policy, cfg, generator=torch.Generator().manual_seed(3)),
                         policy.renderer(True), cfg, max_positions=2048) for _ in range(2)]
    assert runs[0] == runs[1]
    stats = summarize(runs[0])
    assert set(stats) >= {"success_rate", "format_valid_rate", "return_mean", "response_tokens_mean"}


def test_a_pass_limit_plays_the_episodes_pass_by_pass_each_to_its_end(tokenizer):
    """rollout.max_episodes_per_pass k: no sampling call sees more than k episodes, the passes play one after the
    other from one random stream (as if each were its own `run_episodes` call on one responder), and the
    trajectories come back in the specs' order; a limit at or over the count is no limit."""
    model = build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                             intermediate_size=64, max_positions=2048, seed=0)
    policy = Policy(model.eval(), tokenizer)
    specs = [EpisodeSpec(tag, 30 + i, i // 2) for i, tag in enumerate(["sokoban", "sokoban", "frozen_lake",
                                                                        "frozen_lake", "bandit"])]

    def rollout(cfg, chunks):
        respond, calls = policy_responder(policy, cfg, generator=torch.Generator().manual_seed(5)), []

        def counting(prompts, envs):
            calls.append(list(envs))  # held, so no later env takes one's id
            return respond(prompts, envs)
        played = [t for chunk in chunks for t in run_episodes(chunk, counting, policy.renderer(True), cfg,
                                                               max_positions=2048)]
        return played, calls

    whole, whole_calls = rollout(RolloutConfig(max_new_tokens=12), [specs])
    limited, calls = rollout(RolloutConfig(max_new_tokens=12, max_episodes_per_pass=2), [specs])
    by_hand, _ = rollout(RolloutConfig(max_new_tokens=12), [specs[:2], specs[2:4], specs[4:]])
    assert max(len(c) for c in whole_calls) == 5 and max(len(c) for c in calls) == 2
    seen, starts = set(), 0
    for before, call in zip([[], *calls], calls):  # a call goes on with the last one's episodes or starts a pass
        ids = {id(env) for env in call}
        assert ids <= {id(env) for env in before} or not ids & seen
        seen, starts = seen | ids, starts + (not ids & seen)
    assert starts == 3
    assert [(t.tag, t.seed, t.group_id) for t in limited] == [(s.tag, s.seed, s.group_id) for s in specs]
    assert limited == by_hand and limited != whole  # other random draws than one batch's
    assert rollout(RolloutConfig(max_new_tokens=12, max_episodes_per_pass=5), [specs])[0] == whole


def test_one_responder_serves_batch_after_batch(tokenizer):
    """`evaluate_policy` plays its passes through one responder, which tells a new batch by its envs' ids. An id
    names an object only while it lives: a new env can take a freed one's address, and the responder would then
    feed a fresh episode to an old row ("does not extend"). It keeps its session's envs alive, so batch after
    batch of one episode each (where CPython reuses addresses most) each get a new session."""
    import gc
    import weakref

    model = build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                             intermediate_size=64, max_positions=2048, seed=0)
    policy = Policy(model.eval(), tokenizer)
    cfg = RolloutConfig(max_new_tokens=8)
    respond = policy_responder(policy, cfg, generator=torch.Generator().manual_seed(0))
    seen = []

    def watching(prompts, envs):
        seen.extend(weakref.ref(env) for env in envs)
        return respond(prompts, envs)

    for k in range(60):
        run_episodes([EpisodeSpec(("bandit", "sokoban", "frozen_lake")[k % 3], 100 + k, 0)], watching,
                     policy.renderer(True), cfg, max_positions=2048)
    gc.collect()
    assert seen[-1]() is not None  # the last batch's env lives on with the responder's session


@pytest.mark.parametrize("family", ["tiny", "qwen3_5", "mpt", "windowed"])
def test_sampled_logprobs_equal_a_rescoring_of_the_whole_episode(tokenizer, family):
    """What rollout records as each sampled token's log-prob is what training scores on the episode's one
    sequence, over turns in which episodes end at different times and their user messages differ in length: on our
    attention-only model, on a Qwen3.5 (linear-attention layers, whose state a masked position would move), on
    an MPT (ALiBi by key index, to which a masked position adds distance) and on a Qwen2 whose first layer attends
    over a sliding window of 64 cache slots (which a masked position would take)."""
    from transformers import MptConfig, MptForCausalLM

    import qwen3_5
    import windowed
    from ragen.policy.scoring import score_sequences

    if family == "tiny":
        model = build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                                 intermediate_size=64, max_positions=2048, seed=0)
    elif family == "mpt":
        torch.manual_seed(0)
        model = MptForCausalLM(MptConfig(vocab_size=len(tokenizer), d_model=32, n_heads=2, n_layers=2,
                                         expansion_ratio=2, max_seq_len=2048, eos_token_id=tokenizer.eos_token_id,
                                         pad_token_id=tokenizer.pad_token_id, initializer_range=0.2))
    elif family == "windowed":
        model = windowed.windowed_model(tokenizer, 64)
    else:
        model = qwen3_5.text_model(tokenizer)
    policy = Policy(model.eval(), tokenizer)
    specs = [EpisodeSpec("frozen_lake", 3, 0), EpisodeSpec("sokoban", 4, 1), EpisodeSpec("frozen_lake", 5, 2),
             EpisodeSpec("bandit", 8, 3)]  # states of different lengths
    cfg = RolloutConfig(max_new_tokens=10, max_turns=3)
    played = run_episodes(specs, policy_responder(policy, cfg, generator=torch.Generator().manual_seed(0)),
                          policy.renderer(True), cfg, max_positions=policy.max_positions)
    assert sorted(len(t.turns) for t in played) == [1, 3, 3, 3]  # the bandit's episode leaves after one turn
    for traj in played:
        ids = torch.tensor([traj.token_ids])
        rescored, _ = score_sequences(model, ids, torch.ones_like(ids), with_entropy=False)
        sampled = torch.tensor(traj.sampled_mask)
        assert torch.allclose(rescored[0][sampled], torch.tensor(traj.sampled_logprobs)[sampled], atol=1e-4)


def test_episodes_end_before_a_longrope_model_switches_its_rotary_factors(tokenizer):
    """Phi-3's longrope switches its rotary factors for every row of a forward once a position passes
    original_max_position_embeddings, so a longer conversation is not sampled as a fresh pass would score it: the
    policy's max_positions stops there, episodes close before it ("context"), and what they sampled equals a
    rescoring."""
    from transformers import Phi3Config, Phi3ForCausalLM

    from ragen.policy.scoring import score_sequences

    rope = dict(rope_type="longrope", rope_theta=10000.0, short_factor=[1.0] * 8, long_factor=[4.0] * 8,
                original_max_position_embeddings=512)
    torch.manual_seed(0)
    model = Phi3ForCausalLM(Phi3Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                                       num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                       max_position_embeddings=2048, original_max_position_embeddings=512,
                                       rope_parameters=rope, eos_token_id=tokenizer.eos_token_id,
                                       pad_token_id=tokenizer.pad_token_id, initializer_range=0.2))
    policy = Policy(model.eval(), tokenizer)
    assert policy.max_positions == 512
    specs = [EpisodeSpec("frozen_lake", 3, 0), EpisodeSpec("sokoban", 4, 1), EpisodeSpec("frozen_lake", 5, 2)]
    cfg = RolloutConfig(max_new_tokens=10, max_turns=3)
    played = run_episodes(specs, policy_responder(policy, cfg, generator=torch.Generator().manual_seed(0)),
                          policy.renderer(True), cfg, max_positions=policy.max_positions)
    assert {t.end_reason for t in played} == {"context"}
    for traj in played:
        assert len(traj.token_ids) <= 512
        ids = torch.tensor([traj.token_ids])
        rescored, _ = score_sequences(model, ids, torch.ones_like(ids), with_entropy=False)
        sampled = torch.tensor(traj.sampled_mask)
        assert torch.allclose(rescored[0][sampled], torch.tensor(traj.sampled_logprobs)[sampled], atol=1e-4)
