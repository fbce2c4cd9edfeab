"""bench/bench_learning.py: the instance mix behind each step of the rollout-success curve."""

import importlib.util
import sys
from pathlib import Path

import polars as pl
import pytest

from ragen.config import load_config

BENCH = Path(__file__).parents[1] / "bench"
sys.path.insert(0, str(BENCH))  # as when the script runs from bench/
spec = importlib.util.spec_from_file_location("bench_learning", BENCH / "bench_learning.py")
bench_learning = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench_learning)


def test_moves_per_step_follows_the_pool_in_step_order(tmp_path):
    # train pool in seed order; with max_optimal_moves 3 the 5-move and unsolvable instances are left out
    (tmp_path / "sokoban").mkdir()
    pl.DataFrame({"seed": [10, 11, 12, 13, 14, 15, 16],
                  "optimal_moves": [1, 5, 3, 2, None, 2, 1]}).write_parquet(tmp_path / "sokoban" / "train.parquet")
    cfg = load_config(None, ["train.env=sokoban", "train.groups=2", "train.group_size=3",
                             "train.max_optimal_moves=3"])
    # pool [10, 12, 13, 15, 16] (moves 1, 3, 2, 2, 1); step s plays pool[2s], pool[2s + 1], wrapping around
    assert bench_learning.moves_per_step(cfg, str(tmp_path), "sokoban", 4) == pytest.approx([2.0, 2.0, 1.0, 2.5])
