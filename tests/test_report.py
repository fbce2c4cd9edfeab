"""Report helpers: seed means, the Echo Trap marker, PNG curves, markdown tables."""

import math

import pytest

from ragen.report import (CURVES, Series, echo_trap, fall_in_se, first_for_good, markdown_table, mean_series,
                          plot_curves, read_steps_csv, template_collapse, to_series, trailing_means)


def series(std, entropy, success, label="run", first_entropy=None, first_mi=None):
    steps = list(range(len(std)))
    values = {"rollout/in_group_std_mean": std, "actor/entropy": entropy, "val_success": success,
              "actor/grad_norm": [1.0] * len(std),
              "rollout/first_action_entropy": first_entropy or [math.nan] * len(std),
              "rollout/first_action_mi": first_mi or [math.nan] * len(std),
              "rollout/return_mean": [math.nan] * len(std), "rollout/response_distinct_in_group": [math.nan] * len(std)}
    return Series(label, steps, values)


def test_echo_trap_when_std_and_entropy_collapse_and_success_falls():
    s = series(std=[0.4, 0.5, 0.3, 0.04, 0.01, 0.0], entropy=[1.0, 0.9, 0.6, 0.4, 0.2, 0.1],
               success=[0.3, 0.6, 0.7, 0.5, 0.2, 0.1])
    result = echo_trap(s, window=1)
    assert result["collapse_step"] == 3 and result["verdict"] == "echo trap (success collapsed)"
    assert result["best_val_success"] == 0.7 and result["final_val_success"] == 0.1


def test_a_low_success_collapses_by_half_of_its_best():
    # the nonzero-filter Sokoban run: val 0.111 -> 0.023 lost under the 0.1 margin, but more than half its best
    trap = series(std=[5.0, 5.5, 3.0, 1.0, 0.5], entropy=[1.0] * 5, success=[0.10, 0.111, 0.08, 0.05, 0.023])
    assert echo_trap(trap, window=1)["collapse_step"] == 3
    assert echo_trap(trap, window=1)["verdict"] == "echo trap (success collapsed)"
    held = series(std=[5.0, 5.5, 3.0, 1.0, 0.5], entropy=[1.0] * 5, success=[0.10, 0.111, 0.08, 0.07, 0.06])
    assert echo_trap(held, window=1)["verdict"] == "converged (success held)"  # 0.06 is above 0.111 / 2
    high = series(std=[0.4, 0.2, 0.03, 0.0], entropy=[1.0] * 4, success=[0.5, 0.9, 0.85, 0.81])
    assert echo_trap(high, window=1)["verdict"] == "converged (success held)"  # above 0.2 the margin stays 0.1


def test_collapse_with_success_held_is_convergence_and_a_rebound_is_no_collapse():
    held = series(std=[0.4, 0.2, 0.03, 0.0], entropy=[1.0, 0.6, 0.3, 0.2], success=[0.5, 0.9, 0.98, 0.99])
    assert echo_trap(held, window=1)["collapse_step"] == 2
    assert echo_trap(held, window=1)["verdict"] == "converged (success held)"
    rebound = series(std=[0.4, 0.01, 0.3, 0.2], entropy=[1.0, 0.3, 0.3, 0.3], success=[0.5, 0.5, 0.5, 0.5])
    assert echo_trap(rebound, window=1)["collapse_step"] is None and echo_trap(rebound, window=1)["verdict"] == "none"
    # step 0 (the stage-filter batch, high std by construction) does not set the peak
    filtered_start = series(std=[0.9, 0.2, 0.15, 0.1], entropy=[1.0] * 4, success=[0.5, 0.6, 0.2, 0.1])
    assert echo_trap(filtered_start, window=1)["collapse_step"] is None
    assert echo_trap(filtered_start, window=1)["verdict"] == "success collapsed (reward std kept)"


def test_the_echo_trap_marker_reads_the_std_over_a_window_not_one_noisy_step():
    # a 40-step StarPO-S run on Sokoban (`dvc exp run -S train.env=sokoban`, 2026-12-06): eight groups a step, so
    # one step's std swings 0.4-3.6; no trend, yet its last two steps sat under a quarter of the one-step peak
    std = [1.14, 1.15, 2.07, 0.46, 1.17, 3.63, 1.16, 2.04, 1.17, 2.54, 1.5, 1.8, 1.19, 2.24, 1.73, 2.87, 0.81, 0.97,
           1.06, 2.22, 1.89, 1.76, 1.81, 1.44, 2.59, 2.42, 0.43, 2.09, 1.12, 2.06, 2.69, 1.83, 1.79, 2.18, 0.79, 1.93,
           0.81, 1.19, 0.78, 0.76]
    noisy = series(std=std, entropy=[0.7] * 40, success=[0.06] + [math.nan] * 38 + [0.05])
    assert echo_trap(noisy, window=1)["collapse_step"] == 38  # the old reading: a collapse at step 38
    assert echo_trap(noisy)["collapse_step"] is None and echo_trap(noisy)["verdict"] == "none"
    # a real collapse is still found over the window, a few steps after the raw drop (trailing means over 3:
    # 1, 1, 1, 0.7, 0.383, 0.05, ... below 0.25 of the peak 1 from step 6 on)
    real = series(std=[1.0] * 4 + [0.1, 0.05] + [0.0] * 4, entropy=[1.0] * 10, success=[0.5] * 10)
    assert echo_trap(real, window=3)["collapse_step"] == 6
    assert echo_trap(real, window=3)["verdict"] == "converged (success held)"


def test_a_condition_holds_for_good_from_the_start_of_its_last_run():
    assert first_for_good([True, False, True, True]) == 2 and first_for_good([False, True]) == 1
    assert first_for_good([True, True, False]) is None and first_for_good([]) is None


def test_template_marker_needs_low_entropy_and_no_information_for_good():
    flat = [0.3] * 6
    # the opening narrows (entropy below 3/4 of 1.4 = 1.05 from step 3 on) and says nothing of the instance
    template = series(flat, flat, flat, first_entropy=[1.4, 1.3, 1.1, 0.9, 0.5, 0.3],
                      first_mi=[0.02, 0.05, 0.03, 0.01, 0.0, 0.01])
    assert template_collapse(template, window=1) == {"collapse_step": 3, "entropy_first": 1.4, "entropy_last": 0.3,
                                                     "mi_first": 0.02, "mi_last": 0.01}
    # the same entropy fall with the information up is a policy that reads the state: no marker
    reading = series(flat, flat, flat, first_entropy=[1.4, 1.3, 1.1, 0.9, 0.5, 0.3],
                     first_mi=[0.02, 0.1, 0.2, 0.3, 0.2, 0.15])
    assert template_collapse(reading, window=1)["collapse_step"] is None
    # a narrow spell that widens again is no marker; steps without the metric (older csvs) are skipped
    spell = series(flat, flat, flat, first_entropy=[1.4, 0.3, 0.2, 1.2, math.nan, 0.3],
                   first_mi=[0.0, 0.0, 0.0, 0.0, math.nan, 0.0])
    assert template_collapse(spell, window=1)["collapse_step"] == 5
    older = series(flat, flat, flat)
    assert template_collapse(older)["collapse_step"] is None and math.isnan(template_collapse(older)["mi_last"])


def test_template_marker_on_trailing_means():
    # window 2: means 1.4, 1.4, 1.2, 0.6, 0.9, 0.9 (one noisy high step cannot undo it); below 1.05 from step 3
    flat = [0.3] * 6
    noisy = series(flat, flat, flat, first_entropy=[1.4, 1.4, 1.0, 0.2, 1.6, 0.2], first_mi=[0.0] * 6)
    result = template_collapse(noisy, window=2)
    assert result["collapse_step"] == 3
    assert result["entropy_first"] == 1.4 and result["entropy_last"] == pytest.approx(0.9)
    assert template_collapse(noisy, window=1)["collapse_step"] == 5  # step by step, the 1.6 resets it
    assert trailing_means([1.0, 3.0, 5.0, 7.0], 3) == [1.0, 2.0, 3.0, 5.0]


def test_mean_series_averages_seeds_with_a_min_max_band():
    a = series([0.2, 0.4, 0.6], [1.0, 1.0, 1.0], [0.0, 0.5, 1.0], "a")
    b = series([0.4, 0.0], [0.0, 0.5], [1.0, 0.5], "b")
    m = mean_series("ab", [a, b])
    assert m.steps == [0, 1]
    assert m.values["rollout/in_group_std_mean"] == pytest.approx([0.3, 0.2])
    assert m.lo["actor/entropy"] == [0.0, 0.5] and m.hi["actor/entropy"] == [1.0, 1.0]


def test_mean_series_averages_the_val_envs_every_seed_has():
    a = series([0.2, 0.4], [1.0, 1.0], [0.0, 0.5], "a")
    b = series([0.4, 0.0], [0.0, 0.5], [1.0, 0.5], "b")
    a.values.update({"val_success/bandit_test": [0.25, 0.5], "val_success/bandit_rev": [0.0, 1.0]})
    b.values.update({"val_success/bandit_test": [0.75, 1.0]})  # this seed did not validate on bandit_rev
    m = mean_series("ab", [a, b])
    assert m.values["val_success/bandit_test"] == pytest.approx([0.5, 0.75])
    assert m.lo["val_success/bandit_test"] == [0.25, 0.5] and m.hi["val_success/bandit_test"] == [0.75, 1.0]
    assert "val_success/bandit_rev" not in m.values  # a mean of one seed would pass for the variant's


def test_steps_csv_round_trip_and_pngs(tmp_path):
    path = tmp_path / "steps.csv"
    path.write_text("step,val_success,rollout/in_group_std_mean,actor/entropy,actor/grad_norm\n"
                    "0,0.5,0.3,0.9,1.2\n1,,0.2,0.8,1.1\n")
    rows = read_steps_csv(path)
    assert rows[0]["val_success"] == 0.5 and math.isnan(rows[1]["val_success"])
    written = plot_curves([to_series("x", rows), to_series("y", rows)], tmp_path / "plots", "title")
    assert [p.name for p in written] == ["curves.png"] + [f"{k.replace('/', '_')}.png" for k in CURVES]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in written)
    with pytest.raises(FileNotFoundError, match="run stage update first"):
        read_steps_csv(tmp_path / "missing.csv")


def test_markdown_table():
    assert markdown_table(["a", "b"], [("x", 0.12345), ("y", math.nan)]) == \
        "| a | b |\n|---|---|\n| x | 0.123 |\n| y | - |"


def test_fall_in_standard_errors_of_two_evaluations():
    # 0.5 -> 0.3 over 100 episodes each: sqrt((0.25 + 0.21) / 100) = 0.06782; 0.2 / 0.06782 = 2.949
    assert fall_in_se(0.5, 0.3, 100) == pytest.approx(0.2 / math.sqrt(0.46 / 100))
    assert fall_in_se(0.5, 0.3, 100) == pytest.approx(2.949, abs=1e-3)
    # the Sokoban in-loop val of 64 episodes: sqrt((0.071916 + 0.015744) / 64) = 0.03701; 0.062 / 0.03701 = 1.675
    assert fall_in_se(0.078, 0.016, 64) == pytest.approx(1.675, abs=1e-3)
    assert math.isnan(fall_in_se(1.0, 1.0, 64)) and math.isnan(fall_in_se(0.5, 0.3, 0))
    assert fall_in_se(0.2, 0.4, 50) < 0  # a rise is a negative fall
