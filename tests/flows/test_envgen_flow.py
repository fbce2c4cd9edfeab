"""The envgen flow end to end: tables on disk, metrics json, one MLflow run with params, metrics and tags."""

import json

import polars as pl
import pytest
from mlflow.tracking import MlflowClient

from flows.common import staged_dir, write_json
from flows.envgen import envgen
from ragen.instances import SCHEMA
from ragen.tracking import TrackingError

SMALL = ["envs.tags=[sokoban,frozen_lake,bandit]", "envs.train_size=6", "envs.val_size=4", "envs.test_size=3"]


def write_params(project, extra=""):
    (project / "params.yaml").write_text("envs:\n  val_seed: 123\n" + extra)
    return str(project / "params.yaml")


def test_envgen_writes_tables_and_one_mlflow_run(prefect_harness, project):
    summary = envgen(params=write_params(project), overrides=SMALL)

    for tag in ("sokoban", "frozen_lake", "bandit"):
        for split, size in (("train", 6), ("val", 4), ("test", 3)):
            table = pl.read_parquet(project / "data" / "envs" / tag / f"{split}.parquet")
            assert table.schema == SCHEMA and table.height == size
            assert set(table["split"]) == {split} and set(table["tag"]) == {tag}
    val = pl.read_parquet(project / "data/envs/sokoban/val.parquet")
    assert val["seed"].to_list() == [123, 124, 125, 126]

    metrics_file = json.loads((project / "metrics/envgen.json").read_text())
    assert metrics_file == json.loads(json.dumps(summary))
    assert metrics_file["bandit"]["val"]["success_ceiling_mean"] == 1.0

    client = MlflowClient(tracking_uri=f"sqlite:///{project / 'mlruns' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("ragen")
    (parent,) = client.search_runs([experiment.experiment_id], "tags.`ragen.stage` = 'pipeline'")
    (run,) = client.search_runs([experiment.experiment_id], "tags.`ragen.stage` != 'pipeline'")
    assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id
    assert run.info.status == "FINISHED"
    assert run.data.tags["ragen.stage"] == "envgen"
    assert run.data.tags["ragen.env_tags"] == "sokoban,frozen_lake,bandit"
    assert run.data.params["envs.val_size"] == "4"
    assert run.data.metrics["envgen/sokoban/val/count"] == 4.0
    assert run.data.metrics["envgen/frozen_lake/train/success_ceiling_mean"] == pytest.approx(
        summary["frozen_lake"]["train"]["success_ceiling_mean"])
    artifacts = [a.path for a in client.list_artifacts(run.info.run_id)]
    assert "config.yaml" in artifacts
    assert experiment.artifact_location.startswith((project / "mlruns" / "artifacts").as_uri())


def test_bad_config_fails_before_anything_is_written(prefect_harness, project):
    from ragen.config import ConfigError

    with pytest.raises(ConfigError, match="envs.trian_size"):
        envgen(params=write_params(project, "  trian_size: 5\n"))
    assert not (project / "data").exists() and not (project / "mlruns").exists()


def test_unreachable_tracking_server_fails_at_start(prefect_harness, project):
    with pytest.raises(TrackingError, match="did not answer"):
        envgen(params=write_params(project), overrides=SMALL + ["tracking.uri=http://127.0.0.1:9"])
    assert not (project / "data").exists()


def test_staged_dir_keeps_the_old_output_when_a_stage_dies(tmp_path):
    out = tmp_path / "out"
    with staged_dir(out) as staging:
        write_json(staging / "a.json", {"v": 1})
    with pytest.raises(RuntimeError):
        with staged_dir(out) as staging:
            write_json(staging / "a.json", {"v": 2})
            raise RuntimeError("killed half-way")
    assert json.loads((out / "a.json").read_text()) == {"v": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no staging debris
