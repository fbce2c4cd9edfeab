"""bench/bench_llm_cpu.py: the step's scaling by hand, and one measured step of a small model through the loop."""

from pathlib import Path

import pytest

from benchload import load_bench

bench_llm_cpu = load_bench("bench_llm_cpu")


def test_scaling_by_hand():
    measured = {"timing/rollout_s": 2.0, "timing/score_s": 1.0, "timing/update_s": 3.0}
    # 8 episodes -> 128: rollout x16; 4 rows trained -> 32: scoring and update x8
    assert bench_llm_cpu.scaled_step_s(measured, 8, 4, 128, 32) == pytest.approx(2.0 * 16 + 4.0 * 8)


def test_a_small_model_runs_one_step_and_prints_its_row(monkeypatch, capsys):
    monkeypatch.chdir(Path(__file__).resolve().parents[1])  # the project's params.yaml, as a user runs it
    monkeypatch.setattr("sys.argv", ["bench_llm_cpu.py", "--shapes", "small", "--groups", "2", "--group-size", "2",
                                     "envs.tags=[sokoban]", "rollout.max_new_tokens=8", "rollout.max_turns=2"])
    assert bench_llm_cpu.main() == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| small |")]
    assert len(rows) == 1
    cells = [cell.strip() for cell in rows[0].strip("|").split("|")]
    assert float(cells[1]) == pytest.approx(1.9, abs=0.2)  # bench_cuda's small shape over our tokenizer
    assert float(cells[6]) > float(cells[5]) > 0  # the scaled step is longer than the measured one
