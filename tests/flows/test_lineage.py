"""What each output of the RL chain records of its settings, and the refusal of an input made with other ones."""

import pytest

from flows.lineage import KEYS, NOT_DECIDING, OtherSettings, check_input, check_policy_env, made_with, own_settings
from ragen.config import load_config
from ragen.fileio import StageFileError


def config(*overrides):
    return load_config(None, list(overrides))


def test_a_stage_records_its_own_keys_whole_sections_included_and_none_that_change_memory_or_placement():
    rollout = own_settings("rollout", config("train.env=sokoban", "rollout.temperature=0.7"))
    assert rollout["train.env"] == "sokoban" and rollout["rollout.temperature"] == 0.7
    assert {key for key in rollout if key.startswith("rollout.")} == {
        "rollout.max_turns", "rollout.max_actions_per_turn", "rollout.max_new_tokens", "rollout.temperature",
        "rollout.top_p", "rollout.top_k", "rollout.enable_think", "rollout.format_penalty",
        "rollout.max_episodes_per_pass"}  # its passes draw other random numbers than one batch: it decides
    assert "train.steps" not in rollout and "train.lr" not in rollout and "algo.shaping" in rollout
    fit = own_settings("critic_fit", config())
    assert "train.mini_batch_size" in fit and "critic.warmup_epochs" in fit and "algo.lam" not in fit
    for stage in KEYS:
        assert not set(own_settings(stage, config())) & set(NOT_DECIDING)


def test_an_output_carries_its_inputs_record_and_adds_its_own():
    cfg = config()
    rollout = made_with("rollout", cfg)
    filtered = made_with("filter", cfg, rollout)
    assert list(filtered) == ["rollout", "filter"] and filtered["rollout"] == rollout["rollout"]
    assert filtered["filter"]["filter.keep_ratio"] == 0.25
    assert list(made_with("critic_fit", cfg, None)) == ["critic_fit"]  # an input without a record


def test_the_same_settings_pass_and_memory_placement_and_unrecorded_keys_may_differ():
    record = made_with("critic_fit", config(), made_with("filter", config(), made_with("rollout", config())))
    check_input("in.parquet", record, config(), "update", [])
    check_input("in.parquet", record, config("train.micro_batch_size=2", "model.device=cpu", "train.lr=0.1",
                                             "train.steps=3", "algo.clip_eps_high=0.2"), "update", [])
    check_input("in.parquet", None, config("train.env=sokoban"), "update", [])  # no record: taken as it is
    with pytest.raises(OtherSettings, match=r"rollout.max_episodes_per_pass=0 in stage rollout \(this run: 32\)"):
        check_input("in.parquet", record, config("rollout.max_episodes_per_pass=32"), "update", [])
    for damaged in ([1, 2], {"rollout": 5}):
        with pytest.raises(StageFileError, match=r"in.parquet: its settings record is not a mapping of stage to "
                                                 r"settings; delete it and run `dvc repro`"):
            check_input("in.parquet", damaged, config(), "update", [])


def test_other_settings_are_refused_naming_each_and_the_stages_to_rerun_first():
    record = made_with("filter", config(), made_with("rollout", config()))
    overrides = ["train.env=frozen_lake", "filter.keep_ratio=1.0"]
    with pytest.raises(OtherSettings) as refused:
        check_input("data/rollouts/filtered.parquet", record, config(*overrides), "update", overrides)
    assert str(refused.value) == (
        "data/rollouts/filtered.parquet was made with other settings than this run's: train.env=bandit in stage "
        "rollout (this run: frozen_lake); filter.keep_ratio=0.25 in stage filter (this run: 1.0); run stages "
        "rollout, filter and critic_fit with this run's settings first (`python -m flows.rollout "
        "train.env=frozen_lake filter.keep_ratio=1.0`, then the next likewise), or the whole pipeline with them: "
        "`dvc repro` after editing params.yaml, or `dvc exp run -S key=value ...`")
    # only the filter's settings differ: the stages from filter on; one stage is named alone
    with pytest.raises(OtherSettings, match=r"\(this run: mean\); run stages filter and critic_fit with .* "
                                            r"\(`python -m flows.filter algo.reward_norm=mean`, then the next"):
        check_input("f.parquet", record, config("algo.reward_norm=mean"), "update", ["algo.reward_norm=mean"])
    with pytest.raises(OtherSettings, match=r"\(this run: 5\); run stage rollout with this run's settings first "
                                            r"\(`python -m flows.rollout`\), or"):
        check_input("b.parquet", made_with("rollout", config()), config("train.seed=5"), "filter", None)


def test_evaluate_refuses_a_policy_trained_on_another_env():
    check_policy_env("models/policy", {"env": "bandit", "steps": 40}, config("train.env=bandit"))
    check_policy_env("models/base", {"source": "tiny"}, config("train.env=sokoban"))  # no env recorded
    with pytest.raises(OtherSettings, match=r"^models/policy was trained on bandit, and this run evaluates "
                                            r"train.env=sokoban; evaluate it with train.env=bandit, or train"):
        check_policy_env("models/policy", {"env": "bandit"}, config("train.env=sokoban"))
