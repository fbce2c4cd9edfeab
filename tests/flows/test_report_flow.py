"""Stage report's text: the headline against the base, and the Echo Trap line's fall in standard errors."""

from flows.report import fall_sentence, gap_cell, headline


def test_the_fall_is_given_in_standard_errors_only_when_success_fell():
    text = fall_sentence({"best_val_success": 0.078, "final_val_success": 0.016}, 64)
    assert "1.7 SE below its best (0.078 -> 0.016, 64 episodes an evaluation)" in text
    assert fall_sentence({"best_val_success": 1.0, "final_val_success": 1.0}, 64) == ""  # bandit at its best
    assert fall_sentence({"collapse_step": None, "verdict": "no data"}, 64) == ""


def test_the_headline_is_the_evaluation_against_the_base_on_the_same_episodes():
    val = {"success_rate": 0.96875, "episodes": 256, "base_success_rate": 0.59375, "success_gap": 0.375,
           "success_gap_se": 0.03125}
    assert headline("bandit", val, 0.5) == (
        "Val success of `bandit` at temperature 0.5 (stage evaluate, 256 episodes): **0.594 for the base policy -> "
        "0.969 trained, gap +0.375 ± 0.031 (+12.0 SE)**, paired over the same instances.")
    assert gap_cell(val) == "+0.375 ± 0.031 (+12.0 SE)"
    assert gap_cell({**val, "success_gap": 0.0, "success_gap_se": 0.0}) == "+0.000 ± 0.000"  # identical results
    alone = {"success_rate": 0.96875, "episodes": 256}  # eval.against_base=false
    assert headline("bandit", alone, 0.5).endswith("**0.969** (eval.against_base was off: no base figure).")
    assert gap_cell(alone) == ""
