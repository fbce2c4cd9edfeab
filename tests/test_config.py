"""params.yaml against its schema: the shipped file loads, typos and bad values are named."""

import re
from pathlib import Path

import pytest

from ragen.config import Config, ConfigError, flatten, load_config, to_dict

ROOT = Path(__file__).resolve().parents[1]


def test_shipped_params_load_into_the_schema():
    cfg = load_config(ROOT / "params.yaml")
    assert isinstance(cfg, Config)
    assert cfg.envs.val_seed == 123 and cfg.envs.train_seed == 10000  # RAGEN's seeds
    assert "sokoban" in cfg.envs.tags


def test_shipped_params_name_every_key_dvc_should_track():
    # DVC tracks what params.yaml holds: a key left to the schema's default is invisible to `dvc params diff` and
    # `dvc exp show`. Only the run-identity keys that `ragen ablate` sets per run stay out.
    from omegaconf import OmegaConf

    shipped = set(flatten(OmegaConf.to_container(OmegaConf.load(ROOT / "params.yaml"))))
    schema = set(flatten(to_dict(Config())))
    set_per_run = {"tracking.pipeline_run", "tracking.parent_run_id", "tracking.ablation_set", "tracking.variant"}
    assert schema - shipped == set_per_run
    assert shipped <= schema


def write(tmp_path, text):
    path = tmp_path / "params.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    "text, message",
    [
        ("envs:\n  trian_size: 3\n",
         r"unknown key 'envs.trian_size' \(did you mean 'envs.train_size'\?\); known keys under 'envs': tags, "
         r"train_size"),
        ("env:\n  train_size: 3\n",
         r"unknown key 'env' \(did you mean 'envs'\?\); known keys at the top level: envs, model, base, rollout, "
         r"filter"),
        ("envs:\n  train_size: many\n", "bad value for 'envs.train_size'"),
        ("envs:\n  tags: [sokoban, sokobn]\n",
         r"envs.tags: unknown env tag 'sokobn' \(did you mean 'sokoban'\?\); known tags: bandit, "),
        ("envs:\n  tags: [bandit, bandit]\n",
         "envs.tags: duplicate tags in ['bandit', 'bandit']; name each env once"),
        ("envs:\n  val_size: 0\n", "envs.val_size must be positive"),
        ("envs:\n  val_seed: 10100\n", "overlap"),
        ("envs: [1, 2\n", "not valid YAML"),
        ("model:\n  attn: flash\n", "model.attn: 'flash' is not one of auto, sdpa, eager"),
        ("model:\n  grid_tokens: chars\n", "model.grid_tokens: 'chars' is not one of bpe, cells"),
        ("filter:\n  within: best\n", "filter.within: 'best' is not one of all, best_success"),
        ("base:\n  loss_mask: env\n", "base.loss_mask: 'env' is not one of assistant, all"),
        ("algo:\n  outcome: best_success\n  reward_placement: turn\n", "needs algo.reward_placement=last"),
        ("envs:\n  tags: [bandit]\nbase:\n  envs: [sokoban]\n", "base.envs: ['sokoban'] not in envs.tags"),
        ("base:\n  envs: [sokoban, sokoban]\n", "base.envs: duplicate tags in ['sokoban', 'sokoban']; name each"),
        ("eval:\n  samples: 0\n", "eval.samples must be >= 1"),
        ("model:\n  chat_template: chatml.jinja\n", "model.chat_template: applies to model.source hf only"),
        ("critic:\n  ppo_epochs: -1\n", "critic.ppo_epochs must be >= 0"),
        ("train:\n  micro_batch_size: -4\n", r"train.micro_batch_size must be >= 0.*0: the whole mini-batch"),
        ("train:\n  micro_batch_tokens: -1\n", r"train.micro_batch_tokens must be >= 0.*0: no limit"),
        ("rollout:\n  max_episodes_per_pass: -8\n", r"rollout.max_episodes_per_pass must be >= 0.*0: every episode"),
        ("critic:\n  warmup_epochs: -2\n", "critic.warmup_epochs must be >= 0"),
        ("model:\n  threads: -1\n", r"model.threads must be >= 0.*0: torch's own count"),
        ("algo:\n  reward_norm_grouping: group\n",
         "algo.reward_norm_grouping: 'group' is not one of state, inductive, batch"),
        ("algo:\n  old_logprobs: vllm\n", "algo.old_logprobs: 'vllm' is not one of rescore, sampler"),
        ("algo:\n  first_action_bonus: entropy\n  reward_placement: turn\n",
         "algo.first_action_bonus entropy adds to whole-trajectory returns"),
        ("algo:\n  first_action_bonus: info\n", "algo.first_action_bonus: 'info' is not one of none, entropy, mi"),
        ("algo:\n  first_action_coef: -1\n", "algo.first_action_coef must be >= 0"),
        ("algo:\n  shaping: oracle\n", "algo.shaping: 'oracle' is not one of none, solver"),
        ("algo:\n  advantage: gea\n",
         r"algo.advantage: 'gea' is not one of gae, bilevel_gae, grpo, rft \(did you mean 'gae'\?\)"),
        ("base:\n  envs: [sokobn]\n", r"base.envs: unknown env tag 'sokobn' \(did you mean 'sokoban'\?\)"),
        ("algo:\n  shaping: solver\n", "algo.shaping solver: train.env bandit has no solver potential.*shaping=none"),
        ("algo:\n  shaping: solver\n  shaping_coef: 0\ntrain:\n  env: sokoban\n", "algo.shaping_coef must be > 0"),
        ("algo:\n  old_logprobs: sampler\n  loss_mask: all\n",
         "algo.old_logprobs sampler needs algo.loss_mask=assistant"),
        # numeric bounds: each would otherwise fail part way (a modulo by zero at step 1) or train nonsense
        ("train:\n  eval_every: 0\n", "train.eval_every must be >= 1, got 0"),
        ("train:\n  checkpoint_every: 0\n", "train.checkpoint_every must be >= 1, got 0"),
        ("train:\n  mini_batch_size: 0\n", "train.mini_batch_size must be >= 1, got 0"),
        ("rollout:\n  max_turns: 0\n", "rollout.max_turns must be >= 1, got 0"),
        ("train:\n  lr: -0.001\n", "train.lr must be > 0, got -0.001"),
        ("critic:\n  value_clip: 0\n", "critic.value_clip must be > 0, got 0.0"),
        ("algo:\n  kl_coef: -0.1\n", "algo.kl_coef must be >= 0, got -0.1"),
        ("algo:\n  gamma: 1.5\n", "algo.gamma must be in [0, 1], got 1.5"),
        ("algo:\n  clip_eps_low: 1.0\n", r"algo.clip_eps_low must be in \(0, 1\)"),
        ("algo:\n  dual_clip: 0.5\n", r"algo.dual_clip must be 0 \(off\) or > 1 \(RAGEN: 3\), got 0.5"),
        ("rollout:\n  format_penalty: 0.1\n", "rollout.format_penalty must be <= 0"),
        # the envs the loop validates on beside train.env
        ("train:\n  val_envs: [bandit_tst]\n",
         r"train.val_envs: unknown env tag 'bandit_tst' \(did you mean 'bandit_test'\?\); known tags: bandit, "),
        ("train:\n  val_envs: [bandit_rev, bandit_rev]\n", "train.val_envs: duplicate tags in ['bandit_rev', "),
        ("envs:\n  tags: [bandit, sokoban]\ntrain:\n  val_envs: [sokoban, frozen_lake]\n",
         r"train.val_envs: ['frozen_lake'] not in envs.tags \(only those have generated val seeds\); add it to "
         r"envs.tags, or pick from ['bandit', 'sokoban']"),
        ("train:\n  val_envs: frozen_lake\n",
         r"'train.val_envs' takes a list, e.g. train.val_envs=[a,b] \(in params.yaml: val_envs: [a, b]\)"),
    ],
)
def test_bad_params_name_the_key(tmp_path, text, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[")):
        load_config(write(tmp_path, text))


def test_overrides_win_and_are_checked(tmp_path):
    path = write(tmp_path, "envs:\n  val_size: 8\n")
    assert load_config(path).envs.val_size == 8
    assert load_config(path, ["envs.val_size=16"]).envs.val_size == 16
    with pytest.raises(ConfigError, match="envs.vall_size"):
        load_config(path, ["envs.vall_size=16"])
    # a key without a value (omegaconf would read it as null and blame the type)
    with pytest.raises(ConfigError, match=r"override 'envs.val_size' is not key=value; write e.g. train.steps=10"):
        load_config(path, ["envs.val_size"])


def test_a_refused_key_or_value_names_its_source_and_the_key_meant(tmp_path):
    path = write(tmp_path, "train:\n  groups: many\n")
    # the override, not the file, holds the typo; the nearest known key is offered
    with pytest.raises(ConfigError, match=re.escape("override 'envs.vall_size=16': unknown key 'envs.vall_size' "
                                                    "(did you mean 'envs.val_size'?); known keys under 'envs'")):
        load_config(None, ["envs.train_size=4", "envs.vall_size=16"])
    with pytest.raises(ConfigError, match=re.escape("override 'tain.steps=2': unknown key 'tain' (did you mean "
                                                    "'train'?); known keys at the top level")):
        load_config(None, ["tain.steps=2"])
    with pytest.raises(ConfigError, match=re.escape("override 'train.steps=ten': bad value for 'train.steps'")):
        load_config(None, ["train.steps=ten"])
    # the file's bad value is the file's, though an override would set the same key
    with pytest.raises(ConfigError, match=re.escape(f"{path}: bad value for 'train.groups'")):
        load_config(path, ["train.groups=3"])
    with pytest.raises(ConfigError, match=re.escape("override 'algo.zzz=1': unknown key 'algo.zzz'; known keys")):
        load_config(None, ["algo.zzz=1"])  # nothing near it: no guess
    # an override's value is YAML: one cut short is named, not a parser traceback
    with pytest.raises(ConfigError, match=re.escape("override 'envs.tags=[bandit,': the value is not valid YAML "
                                                    "(expected the node content, but found '<stream end>')")):
        load_config(None, ["envs.tags=[bandit,"])


def test_val_envs_come_after_train_env_each_once(tmp_path):
    path = write(tmp_path, "train:\n  env: bandit\n")
    assert load_config(path).train.val_tags() == ["bandit"]
    cfg = load_config(path, ["train.val_envs=[bandit_rev,bandit,bandit_test]"])
    assert cfg.train.val_tags() == ["bandit", "bandit_rev", "bandit_test"]  # train.env listed again: played once
    with pytest.raises(ConfigError, match=re.escape("override 'envs.tags=bandit': 'envs.tags' takes a list")):
        load_config(path, ["envs.tags=bandit"])


def test_missing_file_is_clear(tmp_path):
    with pytest.raises(ConfigError, match="no such params file"):
        load_config(tmp_path / "nope.yaml")


def test_flatten_for_mlflow_params():
    flat = flatten(to_dict(load_config(None)))
    assert flat["envs.val_seed"] == 123 and flat["tracking.experiment"] == "ragen"


def test_presets_expand_and_later_overrides_win():
    cfg = load_config(ROOT / "params.yaml", ["preset=starpo_grpo"])
    assert (cfg.algo.advantage, cfg.filter.keep_ratio, cfg.algo.clip_eps_high, cfg.algo.kl, cfg.algo.kl_coef) == (
        "grpo", 1.0, 0.2, "loss_k1", 0.001)
    assert load_config(ROOT / "params.yaml", ["preset=starpo_ppo", "filter.keep_ratio=0.5"]).filter.keep_ratio == 0.5
    s = load_config(ROOT / "params.yaml", ["preset=starpo_s"])
    assert (s.algo.advantage, s.filter.keep_ratio, s.algo.clip_eps_high, s.algo.kl) == ("gae", 0.25, 0.28, "none")
    r = load_config(ROOT / "params.yaml", ["preset=rft"])
    assert (r.algo.advantage, r.filter.within, r.filter.keep_ratio, r.algo.kl) == ("rft", "best_success", 1.0, "none")
    with pytest.raises(ConfigError, match="unknown preset 'starpo_x'"):
        load_config(ROOT / "params.yaml", ["preset=starpo_x"])
