"""Stage report's text: the Echo Trap line says how far val success fell, in standard errors."""

from flows.report import fall_sentence


def test_the_fall_is_given_in_standard_errors_only_when_success_fell():
    text = fall_sentence({"best_val_success": 0.078, "final_val_success": 0.016}, 64)
    assert "1.7 SE below its best (0.078 -> 0.016, 64 episodes an evaluation)" in text
    assert fall_sentence({"best_val_success": 1.0, "final_val_success": 1.0}, 64) == ""  # bandit at its best
    assert fall_sentence({"collapse_step": None, "verdict": "no data"}, 64) == ""
