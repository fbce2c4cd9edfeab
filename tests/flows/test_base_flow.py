"""The base flow: tiny warm start and the hf path, end to end on a small configuration."""

import hashlib
import json
import os

import pytest
import torch
from mlflow.tracking import MlflowClient
from transformers import Qwen2Config, Qwen2ForCausalLM

from flows.base import base
from flows.envgen import envgen
from ragen.policy import load_policy
from ragen.policy.fingerprint import digest
from ragen.policy.model import ModelLoadError
from ragen.policy.tokenizer import OPERATOR_TOKENS, env_corpus, train_tokenizer

SMALL = ["envs.tags=[bandit,sokoban]", "envs.train_size=8", "envs.val_size=4", "envs.test_size=2",
         "model.vocab_size=320", "model.hidden_size=32", "model.num_layers=1", "model.num_heads=2",
         "model.num_kv_heads=1", "model.intermediate_size=64", "base.tokenizer_episodes=4",
         "base.episodes_per_env=6", "base.steps=4", "base.batch_tokens=400", "base.warmup_steps=2",
         "base.eval_episodes=3", "rollout.max_new_tokens=12"]


@pytest.fixture
def with_envs(prefect_harness, project):
    (project / "params.yaml").write_text("envs:\n  val_seed: 123\n")
    envgen(params=str(project / "params.yaml"), overrides=SMALL)
    return project


def runs_of(project, stage):
    client = MlflowClient(tracking_uri=f"sqlite:///{project / 'mlruns' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("ragen")
    return client, client.search_runs([experiment.experiment_id], f"tags.`ragen.stage` = '{stage}'")


def test_tiny_base_is_trained_saved_measured_and_tracked(with_envs):
    project = with_envs
    results = base(params=str(project / "params.yaml"), overrides=SMALL)
    policy = load_policy(project / "models/base", device="cpu")
    # the BPE vocabulary of model.vocab_size, plus Countdown's four operator tokens
    assert policy.model.config.hidden_size == 32 and len(policy.tokenizer) == 320 + len(OPERATOR_TOKENS)
    assert json.loads((project / "models/base/ragen_meta.json").read_text()) == {"source": "tiny", "mode": "warm"}
    saved = json.loads((project / "metrics/base.json").read_text())
    assert set(saved) == {"bandit", "sokoban"} == set(results)
    for metrics in saved.values():
        assert {"format_valid_rate", "success_rate", "random_success_rate"} <= set(metrics)
    client, runs = runs_of(project, "base")
    run = runs[0]
    assert run.info.status == "FINISHED" and run.data.tags["ragen.model_source"] == "tiny"
    history = client.get_metric_history(run.info.run_id, "sft/loss")
    assert [m.step for m in history] == [0, 1, 2, 3]
    assert "base/sokoban/format_valid_rate" in run.data.metrics
    assert run.data.metrics["base/sft_sequences"] == 6 + 6 * 5  # sokoban's 6 episodes, bandit's 6 x max_turns
    assert "samples/base_val_episodes.json" in [a.path for a in client.list_artifacts(run.info.run_id, "samples")]


def test_same_params_same_base_model(with_envs):
    project = with_envs
    base(params=str(project / "params.yaml"), overrides=SMALL)
    first = load_policy(project / "models/base", device="cpu").model.state_dict()
    base(params=str(project / "params.yaml"), overrides=SMALL)
    second = load_policy(project / "models/base", device="cpu").model.state_dict()
    assert all(torch.equal(first[k], second[k]) for k in first)


def test_the_warm_data_and_random_baseline_do_not_depend_on_the_sampling_passes(with_envs):
    """A script draws its actions from one stream turn by turn across its batch, and holds no KV cache: it plays in
    one pass whatever rollout.max_episodes_per_pass says, so the base's weights and its random baseline stay."""
    project = with_envs
    base(params=str(project / "params.yaml"), overrides=SMALL)
    first = load_policy(project / "models/base", device="cpu").model.state_dict()
    whole = json.loads((project / "metrics/base.json").read_text())
    base(params=str(project / "params.yaml"), overrides=[*SMALL, "rollout.max_episodes_per_pass=2"])
    second = load_policy(project / "models/base", device="cpu").model.state_dict()
    passes = json.loads((project / "metrics/base.json").read_text())
    assert all(torch.equal(first[k], second[k]) for k in first)
    assert [m["random_success_rate"] for m in passes.values()] == [m["random_success_rate"] for m in whole.values()]


def test_grid_tokens_cells_reaches_the_saved_tokenizer(with_envs):
    project = with_envs
    base(params=str(project / "params.yaml"), overrides=[*SMALL, "model.grid_tokens=cells"])
    tokenizer = load_policy(project / "models/base", device="cpu").tokenizer  # as every later stage loads it
    grid = "#####\n#_PX#\n#O__#\n#####"
    assert [tokenizer.decode([i]) for i in tokenizer.encode(grid, add_special_tokens=False)] == list(grid)


def test_hf_base_records_the_local_path_and_its_files(with_envs, tmp_path):
    """The record names the checkpoint's files as base read them; overwritten in place afterwards (same shapes, so
    the same size), a later stage's load refuses it, naming the file and the fix."""
    project = with_envs
    tokenizer = train_tokenizer(env_corpus(["bandit", "sokoban"], 4), 320)
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=2048,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    ckpt = tmp_path / "qwen"
    Qwen2ForCausalLM(config).save_pretrained(ckpt, safe_serialization=True)
    tokenizer.save_pretrained(ckpt)
    for file in ckpt.iterdir():  # as a checkpoint downloaded a while ago
        os.utime(file, ns=(file.stat().st_atime_ns, file.stat().st_mtime_ns - 10**11))
    base(params=str(project / "params.yaml"), overrides=SMALL + ["model.source=hf", f"model.path={ckpt}"])
    meta = json.loads((project / "models/base/ragen_meta.json").read_text())
    files = meta.pop("files")
    assert meta == {"source": "hf", "path": str(ckpt.resolve())}
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(files)
    weights = (ckpt / "model.safetensors").read_bytes()
    assert files["model.safetensors"]["sha256"] == hashlib.sha256(weights).hexdigest()
    assert files["model.safetensors"]["bytes"] == len(weights)
    _, runs = runs_of(project, "base")
    assert runs[0].data.tags["ragen.checkpoint_sha256"] == digest(files)
    assert load_policy(project / "models/base", device="cpu").model.config.hidden_size == 32

    torch.manual_seed(1)
    Qwen2ForCausalLM(config).save_pretrained(ckpt, safe_serialization=True)  # other weights over the same files
    assert len((ckpt / "model.safetensors").read_bytes()) == len(weights)
    with pytest.raises(ModelLoadError, match=rf"models/base: the checkpoint {ckpt.resolve()} has changed since stage "
                                             r"base recorded it \(model.safetensors has other content\).*"
                                             r"`dvc repro -f -s base`"):
        load_policy(project / "models/base", device="cpu")


def test_missing_hf_path_fails_before_writing(with_envs, tmp_path):
    project = with_envs
    with pytest.raises(ModelLoadError, match="does not exist"):
        base(params=str(project / "params.yaml"), overrides=SMALL + ["model.source=hf", f"model.path={tmp_path / 'no'}"])
    assert not (project / "models").exists()


def test_sft_mode_trains_on_solver_demonstrations(with_envs):
    """`base.envs` narrows the demonstrations to sokoban; the base is still measured on every env."""
    project = with_envs
    results = base(params=str(project / "params.yaml"), overrides=SMALL + ["base.mode=sft", "base.envs=[sokoban]"])
    assert json.loads((project / "models/base/ragen_meta.json").read_text()) == {"source": "tiny", "mode": "sft"}
    assert set(results) == {"bandit", "sokoban"}
    _, runs = runs_of(project, "base")
    assert runs[0].data.tags["ragen.base_mode"] == "sft"
    assert runs[0].data.metrics["base/sft_sequences"] == 6
