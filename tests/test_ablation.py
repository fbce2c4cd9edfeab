"""Ablation sets: expansion, seeds, and every bad knob caught before anything runs."""

import pytest

from ragen.ablation import AblationError, expand_set, read_ablations, runner_spec, set_names, thread_workers

PARAMS = "params.yaml"


@pytest.fixture(scope="module")
def committed():
    return read_ablations("ablations.yaml")


def test_committed_sets_expand_and_validate(committed):
    assert {"echo_trap", "filter_ratio", "filter_rule", "clip", "kl", "group_size", "actions_per_turn",
            "paper"} <= set(set_names(committed))
    for name in set_names(committed):
        assert expand_set(committed, name, params=PARAMS).runs


def test_seeds_multiply_variants_and_overrides_keep_their_order(committed):
    echo = expand_set(committed, "echo_trap", params=PARAMS, extra=["train.steps=10"])
    assert [r.name for r in echo.runs][:4] == ["starpo_grpo-s0", "starpo_grpo-s1", "starpo_grpo-s2", "starpo_ppo-s0"]
    assert echo.runs[1].overrides == ("train.env=bandit", "preset=starpo_grpo", "train.seed=1", "train.steps=10")
    assert {r.variant for r in echo.runs} == {"starpo_grpo", "starpo_ppo", "starpo_s"}


def test_group_size_variants_keep_the_batch_fixed(committed):
    from ragen.config import load_config

    sizes = {r.name: load_config(PARAMS, list(r.overrides)).train for r in expand_set(committed, "group_size").runs}
    assert {t.groups * t.group_size for t in sizes.values()} == {128}
    assert len({t.group_size for t in sizes.values()}) == 3


def test_the_generalisation_set_validates_on_the_envs_stage_evaluate_tests(committed):
    """ablations.yaml writes the paper's generalisation envs out again (a set is overrides); they must stay
    flows/evaluate.py's, or the set's in-loop val curves would be of other envs than its evaluation."""
    from flows.evaluate import GENERALISATION
    from ragen.config import load_config

    trains = [load_config(PARAMS, list(r.overrides)).train for r in expand_set(committed, "generalisation").runs]
    assert {t.env: list(t.val_envs) for t in trains} == GENERALISATION


@pytest.mark.parametrize("data,needle", [
    ({"s": {"variants": {"a": ["algo.clip_hi=0.3"]}}}, "unknown key 'algo.clip_hi'"),
    ({"s": {"variants": {"a": ["preset=starpo_x"]}}}, "unknown preset 'starpo_x'"),
    ({"s": {"variants": {"a": ["model.hidden_size=64"]}}}, "model.hidden_size"),
    ({"s": {"variants": {"a": ["filter.keep_ratio"]}}}, "expected key=value"),
    ({"s": {"variants": {}}}, "non-empty mapping"),
    ({"s": {"variants": {"a": []}, "seed": [1]}}, "unknown key(s) ['seed']"),
    ({"s": {"variants": {"a": ["filter.keep_ratio=1.5"]}}}, "keep_ratio must be in (0, 1]"),
    # before: "needs a non-empty mapping 'variants'", a list of the string's characters, int()'s traceback and two
    # runs of one name writing into one folder
    ({"s": {"variant": {"a": []}}}, "unknown key(s) ['variant'] (did you mean 'variants'?)"),
    ({"s": {"variants": {"a": "preset=starpo_s"}}}, "variant 'a' is 'preset=starpo_s'; give the overrides as a list"),
    ({"s": {"variants": {"a": []}, "common": "train.env=sokoban"}}, "common is 'train.env=sokoban'; give the"),
    ({"s": {"variants": {"a": []}, "seeds": ["a"]}}, "seeds ['a'] is not a list of distinct whole numbers >= 0"),
    ({"s": {"variants": {"a": []}, "seeds": 3}}, "seeds 3 is not a list"),
    ({"s": {"variants": {"a": []}, "seeds": [0, 0]}}, "seeds [0, 0] is not a list of distinct"),
    ({"s": {"variants": {"a": []}, "seeds": [{"a": 1}]}}, "seeds [{'a': 1}] is not a list"),
])
def test_bad_sets_fail_naming_the_problem(data, needle):
    with pytest.raises(AblationError) as error:
        expand_set(data, "s", params=PARAMS)
    assert needle in str(error.value)
    assert "'s'" in str(error.value)


def test_unknown_set_lists_the_known_ones(committed):
    with pytest.raises(AblationError, match="unknown ablation set 'nope'; known sets: echo_trap"):
        expand_set(committed, "nope")
    with pytest.raises(AblationError, match=r"^unknown ablation set 'echo_trp' \(did you mean 'echo_trap'\?\); known "):
        expand_set(committed, "echo_trp")


def test_runner_spec_takes_the_command_line_over_the_file():
    data = {"runner": {"kind": "threads", "workers": 3}}
    assert runner_spec(data).workers == 3
    assert runner_spec(data, workers=1).workers == 1
    assert runner_spec(data, kind="dask", address="tcp://10.0.0.1:8786").address == "tcp://10.0.0.1:8786"
    with pytest.raises(AblationError, match="needs runner.address"):
        runner_spec(data, kind="ray")
    with pytest.raises(AblationError, match="'mpi' is not one of"):
        runner_spec(data, kind="mpi")
    with pytest.raises(AblationError, match="unknown key"):
        runner_spec({"runner": {"nodes": 4}})
    # a count the thread pool cannot take (it failed in a ValueError traceback after the set had started)
    with pytest.raises(AblationError, match=r"runner.workers: -1 is not a whole number >= 0 \(0: one variant per"):
        runner_spec(data, workers=-1)
    with pytest.raises(AblationError, match="runner.workers: 'two' is not a whole number"):
        runner_spec({"runner": {"workers": "two"}})


def test_variants_on_cuda_run_one_at_a_time_unless_told_otherwise():
    """workers 0: one variant per two cores on the CPU; one at a time on CUDA, where every variant's models and
    optimizer state share the one device; a set number always wins."""
    assert thread_workers(0, "cpu", 16) == 8 and thread_workers(0, "cpu", 1) == 1
    assert thread_workers(0, "cuda", 16) == 1
    assert thread_workers(3, "cuda", 16) == 3 and thread_workers(3, "cpu", 2) == 3
