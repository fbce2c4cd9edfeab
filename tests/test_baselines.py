"""Nightly spec and regression detection against recorded baselines."""

import math

import pytest

from ragen.baselines import Bound, NightlySpecError, check_baselines, read_nightly_spec

BASELINES = {"bandit/val_success": Bound(0.98, min=0.85), "bandit/seconds_per_step": Bound(1.5, max=4.0),
             "grpo/val_success": Bound(0.9, min=0.5, max=1.0)}


def test_values_inside_the_bounds_pass():
    assert check_baselines({"bandit/val_success": 0.85, "bandit/seconds_per_step": 4.0, "grpo/val_success": 1.0},
                           BASELINES) == []


def test_regressions_name_metric_value_and_baseline():
    found = check_baselines({"bandit/val_success": 0.5, "bandit/seconds_per_step": 9.0}, BASELINES)
    assert [r.metric for r in found] == ["bandit/val_success", "bandit/seconds_per_step", "grpo/val_success"]
    assert found[0].message() == "REGRESSION bandit/val_success: 0.5 is below the minimum 0.85 (baseline 0.98)"
    assert found[1].message() == "REGRESSION bandit/seconds_per_step: 9 is above the maximum 4 (baseline 1.5)"
    assert math.isnan(found[2].value) and "missing from the run" in found[2].message()


def test_committed_spec_parses_and_every_baseline_names_an_entry():
    spec = read_nightly_spec("bench/nightly.yaml")
    assert spec.matrix and spec.baselines
    assert all(metric.split("/", 1)[0] in spec.matrix for metric in spec.baselines)
    assert len(spec.schedule.split()) == 5


@pytest.mark.parametrize("text,needle", [
    ("matrix: {}\n", "non-empty 'matrix"),
    ("matrix: {a: [train.steps=2]}\nbaselines: {a/x: {baseline: 1}}\n", "at least one of 'min', 'max'"),
    ("matrix: {a: [train.steps=2]}\nbaselines: {b/x: {baseline: 1, min: 0}}\n", "names no matrix entry"),
    ("matrix: [\n", "not valid YAML"),
    # a typo that would drop every check silently, or fail one as "missing from the run" after the whole matrix
    ("matrix: {a: []}\nbaseline: {a/val_success: {baseline: 1, min: 0}}\n",
     "unknown top-level key 'baseline' (did you mean 'baselines'?); known: schedule, matrix, baselines"),
    ("matrix: {a: []}\nbaselines: {a/val_sucess: {baseline: 1, min: 0}}\n",
     "baseline 'a/val_sucess': the nightly measures no 'val_sucess' (did you mean 'val_success'?); each entry's "
     "figures: val_success, test_success, val_gap, seconds_per_step, rollout_tokens_per_s"),
    ("matrix: {a: []}\nbaselines: {a/val_success: {baseline: 1, mni: 0}}\n",
     "unknown key of baseline 'a/val_success' 'mni' (did you mean 'min'?)"),
    ("matrix: {a: []}\nbaselines: {a/val_success: {baseline: 1, min: low}}\n", "holds a value that is not a number"),
    ("matrix: {a: preset=starpo_s}\n", "matrix entry 'a' is 'preset=starpo_s'; give its overrides as a list"),
    ("schedule: 3\nmatrix: {a: []}\n", "schedule 3 is not a cron string; quote it"),
])
def test_bad_specs_are_named(tmp_path, text, needle):
    path = tmp_path / "nightly.yaml"
    path.write_text(text)
    with pytest.raises(NightlySpecError, match="nightly.yaml") as error:
        read_nightly_spec(path)
    assert needle in str(error.value)
