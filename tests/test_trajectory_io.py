"""Trajectory files: per-instance success rates read back from an evaluation's parquet."""

import polars as pl
import pytest

from ragen.trajectory_io import instance_success_rates


def episodes(path, rows):
    pl.DataFrame(rows, schema=["tag", "seed", "success"], orient="row").write_parquet(path)
    return path


def test_rates_in_the_order_asked_over_each_instances_samples(tmp_path):
    path = episodes(tmp_path / "eval.parquet", [("sokoban", 5, True), ("sokoban", 7, False), ("sokoban", 5, False),
                                                ("sokoban", 7, False), ("bandit", 5, True), ("bandit", 5, True)])
    assert instance_success_rates(path, "sokoban", [7, 5]) == [0.0, 0.5]
    assert instance_success_rates(path, "bandit", [5]) == [1.0]
    assert instance_success_rates(path, "sokoban", [7, 5], samples=2) == [0.0, 0.5]


def test_samples_asked_for_must_match_what_was_played(tmp_path):
    # every instance played twice, as eval.samples=2 writes it; a caller expecting 4 gets the file and the fix
    path = episodes(tmp_path / "eval.parquet", [("sokoban", 5, True), ("sokoban", 5, False)])
    with pytest.raises(ValueError, match=r"eval.parquet: the sokoban instances were played 2 times each, not "
                                         r"eval.samples=4; evaluate again with eval.samples=4"):
        instance_success_rates(path, "sokoban", [5], samples=4)


def test_a_missing_instance_or_uneven_samples_name_the_file(tmp_path):
    path = episodes(tmp_path / "eval.parquet", [("sokoban", 5, True), ("sokoban", 7, False), ("sokoban", 7, True)])
    with pytest.raises(ValueError, match=r"eval.parquet: no sokoban episode of 1 of the 2 instances .*\[9\]"):
        instance_success_rates(path, "sokoban", [5, 9])
    with pytest.raises(ValueError, match=r"played \[1, 2\] times each"):
        instance_success_rates(path, "sokoban", [5, 7])
    with pytest.raises(FileNotFoundError, match="missing"):
        instance_success_rates(tmp_path / "none.parquet", "sokoban", [5])
