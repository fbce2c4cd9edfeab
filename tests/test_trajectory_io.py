"""Trajectory files: a round trip, per-instance success rates read back from an evaluation's parquet, and the
errors a damaged or foreign file gets."""

import polars as pl
import pytest

from ragen.fileio import StageFileError
from ragen.records import Trajectory, Turn
from ragen.trajectory_io import (SETTINGS_KEY, instance_success_rates, read_scores, read_settings, read_trajectories,
                                 write_trajectories)


def played(seed):
    turn = Turn(state="#P_#", response="Left</think><answer>Left</answer>", response_ids=(7, 8, 9),
                response_logprobs=(-0.5, -0.25, -1.0), finish="stop", think="Left", actions=("Left",), executed=1,
                reward=-0.1, penalty=0.0, format_ok=True, actions_valid=True)
    return Trajectory(tag="sokoban", seed=seed, group_id=seed // 2, turns=(turn, turn), env_return=-0.2, penalty=0.0,
                      success=False, num_actions=2, end_reason="turns", token_ids=(1, 2, 7, 8, 9, 3, 7, 8, 9),
                      sampled_mask=(False, False, True, True, True, False, True, True, True),
                      sampled_logprobs=(0.0, 0.0, -0.5, -0.25, -1.0, 0.0, -0.5, -0.25, -1.0), system_len=2,
                      turn_ends=(4, 8))


def test_trajectories_and_scores_round_trip(tmp_path):
    batch = [played(seed) for seed in range(4)]
    write_trajectories(tmp_path / "a.parquet", batch)
    assert read_trajectories(tmp_path / "a.parquet") == batch
    assert read_scores(tmp_path / "a.parquet") is None
    write_trajectories(tmp_path / "b.parquet", batch, scores=[0.5, -0.5, 1.0, -1.0])
    assert read_scores(tmp_path / "b.parquet") == [0.5, -0.5, 1.0, -1.0]
    assert read_settings(tmp_path / "b.parquet") is None
    settings = {"rollout": {"train.env": "sokoban", "rollout.temperature": 0.7, "rollout.enable_think": True}}
    write_trajectories(tmp_path / "c.parquet", batch, settings=settings)
    assert read_settings(tmp_path / "c.parquet") == settings and read_trajectories(tmp_path / "c.parquet") == batch


def test_a_damaged_or_foreign_trajectories_file_is_named_with_the_fix(tmp_path):
    write_trajectories(tmp_path / "good.parquet", [played(seed) for seed in range(4)])
    whole = (tmp_path / "good.parquet").read_bytes()
    (tmp_path / "cut.parquet").write_bytes(whole[:-100])  # a copy cut short
    for read in (read_trajectories, read_scores, read_settings):
        with pytest.raises(StageFileError, match=r"cut.parquet: not a readable parquet file .*; delete it and run "
                                                 r"`dvc repro` to rebuild it"):
            read(tmp_path / "cut.parquet")
    pl.DataFrame({"tag": ["sokoban"]}).write_parquet(tmp_path / "meta.parquet", metadata={SETTINGS_KEY: "{cut"})
    with pytest.raises(StageFileError, match=r"meta.parquet: its ragen.settings metadata is not JSON; delete it"):
        read_settings(tmp_path / "meta.parquet")
    # an instance table (stage envgen's) passed where trajectories belong
    pl.DataFrame({"seed": [1, 2], "optimal_moves": [3, 4]}).write_parquet(tmp_path / "train.parquet")
    with pytest.raises(StageFileError, match=r"train.parquet: no column 'tag', 'group_id', 'turns', .* \(it has "
                                             r"seed, optimal_moves\)"):
        read_trajectories(tmp_path / "train.parquet")
    # trajectories whose turns lack a field that has no default (another version's file)
    rows = pl.read_parquet(tmp_path / "good.parquet").to_dicts()
    for row in rows:
        row["turns"] = [{k: v for k, v in turn.items() if k != "response_ids"} for turn in row["turns"]]
    pl.DataFrame(rows).write_parquet(tmp_path / "other.parquet")
    with pytest.raises(StageFileError, match=r"other.parquet: its turns lack response_ids; it is not a trajectories "
                                             r"file of this version"):
        read_trajectories(tmp_path / "other.parquet")


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
