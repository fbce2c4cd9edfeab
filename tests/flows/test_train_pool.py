"""Stage helpers: the train pool and its difficulty curriculum (train.max_optimal_moves)."""

import polars as pl
import pytest

from flows.common import read_train_pool
from ragen.config import ConfigError, load_config


@pytest.fixture
def envs_dir(tmp_path):
    table = pl.DataFrame({"seed": [10, 11, 12, 13, 14], "optimal_moves": [1, 4, None, 2, 7]},
                         schema={"seed": pl.Int64, "optimal_moves": pl.Int64})
    (tmp_path / "sokoban").mkdir()
    table.write_parquet(tmp_path / "sokoban" / "train.parquet")
    return tmp_path


def test_the_pool_keeps_instances_up_to_the_move_limit_in_table_order(envs_dir):
    assert read_train_pool(envs_dir, "sokoban", 0) == [10, 11, 12, 13, 14]  # 0: every instance, unsolvable too
    assert read_train_pool(envs_dir, "sokoban", 2) == [10, 13]  # the unsolvable one (null) drops out
    assert read_train_pool(envs_dir, "sokoban", 4) == [10, 11, 13]


def test_a_limit_that_leaves_nothing_names_the_easiest_instance_and_the_fix(envs_dir, tmp_path):
    pl.DataFrame({"seed": [1], "optimal_moves": [5]}).write_parquet(envs_dir / "sokoban" / "train.parquet")
    with pytest.raises(ValueError, match=r"max_optimal_moves=3 leaves no train instance of sokoban .*needs 5 moves"):
        read_train_pool(envs_dir, "sokoban", 3)
    with pytest.raises(FileNotFoundError, match="dvc repro envgen"):
        read_train_pool(tmp_path / "nowhere", "sokoban", 3)


def test_a_negative_limit_is_a_config_error(tmp_path):
    params = tmp_path / "params.yaml"
    params.write_text("train:\n  max_optimal_moves: -1\n")
    with pytest.raises(ConfigError, match="max_optimal_moves must be >= 0"):
        load_config(params)
