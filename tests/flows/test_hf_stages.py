"""Every stage on a user's local Hugging Face checkpoint (`model.source: hf`) of another family than ours (slow):
Llama, Gemma 3 and Qwen3.5 (whose linear-attention layers keep a recurrent state).

Each checkpoint is randomly initialised here (no download). The Llama's tokenizer works as Llama 3
Instruct's does (tests/chat_templates.py): begin-of-text, role headers, trimmed content, turns closed by
<|eot_id|>, which only the generation config names as an end token. Run twice: with that template in the
checkpoint, and with one there that drops earlier reasoning (as Qwen3's does, which one token sequence per episode
cannot take) and the Llama 3 style one given as `model.chat_template`.
"""

import json
from pathlib import Path

import pytest
import torch
from transformers import Gemma3ForCausalLM, Gemma3TextConfig, GenerationConfig, LlamaConfig, LlamaForCausalLM

import qwen3_5
from chat_templates import (GEMMA3_STYLE, LLAMA3_STYLE, LLAMA3_THINK_STRIPPING, THINK_STRIPPING, gemma3_style,
                            llama3_style)
from flows.base import base
from flows.critic_fit import critic_fit
from flows.envgen import envgen
from flows.evaluate import evaluate
from flows.filter import filter_rollouts
from flows.rollout import rollout
from flows.update import update_policy
from ragen.policy import load_policy
from ragen.model_meta import read_meta
from ragen.policy.model import ModelLoadError
from ragen.policy.scoring import score_sequences
from ragen.policy.tokenizer import env_corpus, train_tokenizer
from ragen.prompting import SYSTEM_PROMPT
from ragen.trajectory_io import read_trajectories

CHATML = Path(__file__).resolve().parents[2] / "chat_templates/chatml.jinja"
SMALL = ["envs.tags=[sokoban]", "envs.train_size=16", "envs.val_size=4", "envs.test_size=4",
         "rollout.max_new_tokens=16", "rollout.max_turns=3", "train.env=sokoban", "train.groups=4",
         "train.group_size=4", "train.steps=2", "train.eval_every=2", "train.eval_episodes=4",
         "train.checkpoint_every=1", "train.mini_batch_size=8", "filter.keep_ratio=0.5", "critic.warmup_epochs=2",
         "eval.episodes=4", "model.source=hf"]


def llama_checkpoint(path, template=LLAMA3_STYLE):
    tok = llama3_style(train_tokenizer(env_corpus(["sokoban"], 4), 320), template)
    end, eot = tok.convert_tokens_to_ids("<|end_of_text|>"), tok.convert_tokens_to_ids("<|eot_id|>")
    config = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=2048,
                         bos_token_id=tok.bos_token_id, eos_token_id=end)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(bos_token_id=tok.bos_token_id, eos_token_id=[end, eot])
    model.save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    return path


def filter_fit_update(project, params, small, family):
    """Stages filter, critic_fit (a critic of the checkpoint's family) and update (finite); -> the trained policy."""
    filter_rollouts(params=params, overrides=small)
    critic_fit(params=params, overrides=small)
    critic_config = json.loads((project / "models/critic_warm/config.json").read_text())
    assert critic_config["architectures"] == [f"{family}ForTokenClassification"]
    result = update_policy(params=params, overrides=small)
    assert all(torch.isfinite(torch.tensor(v)) for v in result.values() if isinstance(v, float))
    trained = load_policy(project / "models/policy", device="cpu")
    assert type(trained.model).__name__ == f"{family}ForCausalLM"
    return trained


@pytest.mark.slow
@pytest.mark.parametrize("override", [False, True], ids=["own-template", "model.chat_template"])
def test_every_stage_runs_on_a_local_llama_checkpoint(prefect_harness, project, tmp_path_factory, override):
    root = tmp_path_factory.mktemp("llama")
    hf = llama_checkpoint(root / "ckpt", LLAMA3_THINK_STRIPPING if override else LLAMA3_STYLE)
    params = str(project / "params.yaml")
    (project / "params.yaml").write_text("envs:\n  val_seed: 123\n")
    small = [*SMALL, f"model.path={hf}"]
    if override:
        (root / "llama3.jinja").write_text(LLAMA3_STYLE)
        small.append(f"model.chat_template={root / 'llama3.jinja'}")
    envgen(params=params, overrides=small)
    base(params=params, overrides=small)
    (root / "llama3.jinja").unlink(missing_ok=True)  # later stages use the copy stage base recorded
    meta = read_meta(project / "models/base")
    assert "model.safetensors" in meta.pop("files")
    assert meta == {"source": "hf", "path": str(hf.resolve())} | ({"chat_template": LLAMA3_STYLE} if override else {})
    rollout(params=params, overrides=small)
    played = read_trajectories(project / "data/rollouts/base.parquet")
    assert len(played) == 16 and max(len(t.turns) for t in played) > 1
    policy = load_policy(project / "models/base", device="cpu")
    for traj in played:  # the whole episode as the template writes it, turn after turn
        text = policy.tokenizer.decode(traj.token_ids)
        assert text.startswith("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n")
        assert text.count("<|start_header_id|>assistant<|end_header_id|>\n\n<think>") == len(traj.turns)
        assert text.count("<|eot_id|>") == 2 * len(traj.turns) + 1 and text.endswith("<|eot_id|>")
    trained = filter_fit_update(project, params, small, "Llama")
    assert trained.tokenizer.chat_template == LLAMA3_STYLE
    assert {policy.tokenizer.convert_tokens_to_ids("<|eot_id|>")} <= trained.token_texts.stop_ids
    before, after = policy.model.state_dict(), trained.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    results = evaluate(params=params, overrides=small)
    val = results["sokoban"]["val"]
    assert val["success_gap"] == pytest.approx(val["success_rate"] - val["base_success_rate"])
    assert json.loads((project / "metrics/eval.json").read_text()) == json.loads(json.dumps(results))
    if not override:  # the checkpoint overwritten in place (a new revision): a stage that reruns refuses it
        (hf / "model.safetensors").write_bytes((hf / "model.safetensors").read_bytes()[::-1])
        with pytest.raises(ModelLoadError, match=r"models/base: the checkpoint .* has changed since stage base "
                                                 r"recorded it \(model.safetensors has other content\)"):
            evaluate(params=params, overrides=small)


@pytest.mark.slow
def test_every_stage_runs_on_a_gemma3_style_checkpoint(prefect_harness, project, tmp_path_factory):
    """Gemma 3: no system turn in the template (the system prompt opens the first user turn), sliding-window
    attention, and no token-classification class in transformers for the critic."""
    hf = tmp_path_factory.mktemp("gemma") / "ckpt"
    tok = gemma3_style(train_tokenizer(env_corpus(["sokoban"], 4), 320))
    end = tok.convert_tokens_to_ids("<end_of_turn>")
    config = Gemma3TextConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                              num_attention_heads=2, num_key_value_heads=1, head_dim=16, sliding_window=64,
                              max_position_embeddings=2048, bos_token_id=tok.bos_token_id, eos_token_id=[end],
                              pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    Gemma3ForCausalLM(config).save_pretrained(hf, safe_serialization=True)
    tok.save_pretrained(hf)
    params = str(project / "params.yaml")
    (project / "params.yaml").write_text("envs:\n  val_seed: 123\n")
    small = [*SMALL, f"model.path={hf}", "train.micro_batch_size=3",  # passes of 3, 3 and 2 of each mini-batch of 8
             "model.dtype=bf16-mixed"]  # float32 weights, bfloat16 compute, as `auto` on CUDA
    envgen(params=params, overrides=small)
    base(params=params, overrides=small)
    rollout(params=params, overrides=small)
    played = read_trajectories(project / "data/rollouts/base.parquet")
    policy = load_policy(project / "models/base", device="cpu")
    for traj in played:
        assert policy.tokenizer.decode(traj.token_ids[: traj.system_len]) == \
            f"<bos><start_of_turn>user\n{SYSTEM_PROMPT.strip()}"
        assert policy.tokenizer.decode(traj.token_ids).count("<start_of_turn>model\n<think>") == len(traj.turns)
    assert filter_fit_update(project, params, small, "Gemma3").tokenizer.chat_template == GEMMA3_STYLE
    assert "sokoban" in evaluate(params=params, overrides=small)


@pytest.mark.slow
def test_every_stage_runs_on_a_qwen3_5_checkpoint(prefect_harness, project, tmp_path_factory):
    """Qwen3.5: a vision-language checkpoint whose text model mixes linear-attention (Gated DeltaNet) layers with
    attention, and a template that drops earlier reasoning (chat_templates/chatml.jinja, which we ship, given as
    `model.chat_template`). Rollout's sampled log-probs equal a re-scoring of each episode's one sequence, which
    masked holes in the sampler's batches would break on the recurrent layers."""
    root = tmp_path_factory.mktemp("qwen3_5")
    tok = train_tokenizer(env_corpus(["sokoban"], 4), 320)
    tok.chat_template = THINK_STRIPPING
    qwen3_5.save_published(root / "ckpt", tok)
    chatml = CHATML.read_text()
    params = str(project / "params.yaml")
    (project / "params.yaml").write_text("envs:\n  val_seed: 123\n")
    small = [*SMALL, f"model.path={root / 'ckpt'}", f"model.chat_template={CHATML}",  # the template we ship
             "train.micro_batch_tokens=2000"]  # gradients accumulated over passes of at most 2000 padded tokens
    envgen(params=params, overrides=small)
    base(params=params, overrides=small)
    rollout(params=params, overrides=small)
    played = read_trajectories(project / "data/rollouts/base.parquet")
    assert max(len(t.turns) for t in played) > 1
    policy = load_policy(project / "models/base", device="cpu")
    for traj in played:
        ids = torch.tensor([traj.token_ids])
        rescored = score_sequences(policy.model, ids, torch.ones_like(ids), with_entropy=False)[0][0]
        sampled = torch.tensor(traj.sampled_mask)
        assert torch.allclose(rescored[sampled], torch.tensor(traj.sampled_logprobs)[sampled], atol=1e-4)
    assert filter_fit_update(project, params, small, "Qwen3_5").tokenizer.chat_template == chatml
    assert "sokoban" in evaluate(params=params, overrides=small)
