"""Presets: a config is named by the preset whose whole algo and filter sections it matches."""

import pytest

from ragen.config import load_config
from ragen.presets import PRESETS, describe_preset, nearest_preset


@pytest.mark.parametrize("name", list(PRESETS))
def test_each_preset_is_its_own_nearest_with_no_difference(name):
    assert nearest_preset(load_config(None, [f"preset={name}"])) == (name, [])


@pytest.mark.parametrize("knob", ["algo.gamma=0.99", "algo.aggregation=seq-mean-token-mean", "algo.dual_clip=3.0",
                                  "algo.first_action_bonus=entropy", "algo.old_logprobs=sampler",
                                  "algo.reward_placement=turn", "algo.entropy_coef=0.01"])
def test_a_knob_no_preset_names_still_departs_from_the_preset(knob):
    assert nearest_preset(load_config(None, ["preset=starpo_s", knob])) == ("starpo_s", [knob])


def test_params_file_departing_from_the_defaults_is_not_the_preset(tmp_path):
    params = tmp_path / "params.yaml"
    params.write_text("algo:\n  lam: 0.95\nfilter:\n  mode: std_rev\n")
    name, diff = nearest_preset(load_config(params, ["preset=starpo_ppo"]))
    assert (name, diff) == ("starpo_ppo", ["filter.mode=std_rev", "algo.lam=0.95"])


def test_nearest_counts_differing_keys_and_ignores_sections_outside_the_algorithm():
    # starpo_grpo without its KL: 2 keys from starpo_grpo; starpo_s is further (advantage, reward_norm, keep, clip)
    cfg = load_config(None, ["preset=starpo_grpo", "algo.kl=none", "algo.kl_coef=0.0", "train.lr=0.01",
                             "rollout.format_penalty=-1.0", "critic.lr=0.001"])
    assert nearest_preset(cfg) == ("starpo_grpo", ["algo.kl=none", "algo.kl_coef=0.0"])


def test_describe_names_the_preset_or_what_departs_from_the_nearest():
    assert describe_preset(load_config(None, ["preset=rft"])) == "rft"
    cfg = load_config(None, ["preset=starpo_s", "algo.gamma=0.99", "filter.keep_ratio=0.5"])
    assert describe_preset(cfg) == "custom (starpo_s with filter.keep_ratio=0.5, algo.gamma=0.99)"
