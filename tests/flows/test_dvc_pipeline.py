"""`dvc repro` in a real git + DVC repository in a temp folder, as a user runs it (slow)."""

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
import yaml
from mlflow.tracking import MlflowClient

from smallproject import ROOT, write_params


def run(cmd, cwd, env):
    out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, f"{cmd} failed:\n{out.stdout}\n{out.stderr}"
    return out.stdout + out.stderr


@pytest.fixture
def repo(tmp_path):
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    for rel in tracked:
        if (ROOT / rel).is_file():
            (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, tmp_path / rel)
    write_params(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_TRACKING_URI", "PREFECT_", "DVC_"))}
    env.update(PATH=f"{Path(sys.executable).parent}:{env['PATH']}", DVC_NO_ANALYTICS="1",
               GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t")
    run(["git", "init", "-q"], tmp_path, env)
    run(["git", "add", "-A"], tmp_path, env)
    run(["git", "commit", "-qm", "init"], tmp_path, env)
    return tmp_path, env


@pytest.mark.slow
def test_dvc_repro_then_nothing_to_do(repo):
    path, env = repo
    out = run(["dvc", "repro"], path, env)
    for stage in ("envgen", "base", "rollout", "filter", "critic_fit", "update", "evaluate", "report"):
        assert f"Running stage '{stage}'" in out
    assert "![curves](curves.png)" in (path / "reports/pipeline/report.md").read_text()
    assert (path / "models/base/model.safetensors").exists() and (path / "models/policy/model.safetensors").exists()
    for tag in ("sokoban", "frozen_lake", "countdown"):
        assert pl.read_parquet(path / "data/envs" / tag / "val.parquet").height == 4
    assert "up to date" in run(["dvc", "status"], path, env)
    assert "didn't change, skipping" in run(["dvc", "repro"], path, env)

    # `dvc plots show` draws dvc.yaml's named panels, each from a column the csv has, and no panel of the csv's last
    # column (a stage-level plot entry without y drew one)
    panels = json.loads(run(["dvc", "plots", "show", "--json"], path, env))["data"]
    named = yaml.safe_load((path / "dvc.yaml").read_text())["plots"]
    assert sorted(panels) == sorted(name for entry in named for name in entry)
    columns = set(next(csv.reader(open(path / "metrics/train_steps.csv"))))
    assert {column for entry in named for spec in entry.values() for column in spec["y"].values()} <= columns

    # forced rerun as `make run` runs it (one Prefect server, stages forked from the warm stage server):
    # byte-identical outputs (tables and model weights), so dvc.lock does not change
    lock = (path / "dvc.lock").read_text()
    out = run([sys.executable, "-m", "flows.server", "--", "dvc", "repro", "-f"], path, env)
    assert "Running stage 'update'" in out and "did not start" not in out
    assert (path / ".prefect" / "warm_stage_server.log").exists()
    assert (path / "dvc.lock").read_text() == lock

    client = MlflowClient(tracking_uri=f"sqlite:///{path / 'mlruns/mlflow.db'}")
    experiment = client.get_experiment_by_name("ragen").experiment_id
    runs = client.search_runs([experiment], "tags.`ragen.stage` != 'pipeline'")
    assert sorted(r.data.tags["dvc.stage"] for r in runs).count("update") == 2
    (parent,) = client.search_runs([experiment], "tags.`ragen.stage` = 'pipeline'")  # same config and commit
    assert {r.data.tags["mlflow.parentRunId"] for r in runs} == {parent.info.run_id}
    (report,) = client.search_runs([experiment], "tags.`ragen.stage` = 'report'", max_results=1)
    assert {a.path for a in client.list_artifacts(report.info.run_id, "report")} >= {"report/report.md",
                                                                                     "report/curves.png"}

    # the incremental reruns below go through `make run`'s servers too: each stage then skips ~10 s of Prefect
    # server start-up and imports, and what DVC reruns is the same either way
    served = [sys.executable, "-m", "flows.server", "--", "dvc"]

    # a changed filter.keep_ratio reruns filter and what follows, nothing before it
    write_params(path, "filter.keep_ratio=1.0")
    out = run([*served, "repro"], path, env)
    for stage in ("envgen", "base"):
        assert f"Stage '{stage}' didn't change, skipping" in out
    for stage in ("filter", "critic_fit", "update", "evaluate", "report"):
        assert f"Running stage '{stage}'" in out
    assert len(client.search_runs([experiment], "tags.`ragen.stage` = 'pipeline'")) == 2  # a new pipeline run
    write_params(path, "envs.val_size=5")
    out = run([*served, "repro"], path, env)
    assert "Running stage 'envgen'" in out and "Running stage 'base'" in out
    assert pl.read_parquet(path / "data/envs/sokoban/val.parquet").height == 5
    assert "up to date" in run(["dvc", "status"], path, env)

    # an ablation as a DVC experiment: `dvc exp run -S` reruns what the knob feeds, tagged with the experiment
    out = run([*served, "exp", "run", "-S", "algo.clip_eps_high=0.2"], path, env)
    assert "Running stage 'update'" in out and "Stage 'base' didn't change" in out
    exp_runs = client.search_runs([experiment], "tags.`ragen.stage` = 'update' and tags.`dvc.exp_name` != ''")
    assert exp_runs and exp_runs[0].data.params["algo.clip_eps_high"] == "0.2"

    # outside the workspace (`--temp`; a queued experiment runs the same way): DVC runs the stages in a copy under
    # .dvc/tmp/exps/ and deletes it after. A relative core.site_cache_dir failed it at once ("unable to open database
    # file"), and the stages' runs would have gone into the copy's own mlruns/
    out = run(["dvc", "exp", "run", "--temp", "-S", "algo.clip_eps_high=0.24"], path, env)
    assert "Running stage 'update'" in out and "Stage 'base' didn't change" in out
    temp_runs = client.search_runs([experiment], "params.`algo.clip_eps_high` = '0.24'")
    assert {"update", "evaluate", "report"} <= {r.data.tags["ragen.stage"] for r in temp_runs}
    assert all(r.data.tags.get("dvc.exp_name") for r in temp_runs if r.data.tags["ragen.stage"] != "pipeline")
    assert not (path / ".dvc/tmp/exps").exists() or not list((path / ".dvc/tmp/exps").rglob("mlflow.db"))
