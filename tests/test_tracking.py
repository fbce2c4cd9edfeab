"""MLflow tracking: stage runs nest under one pipeline run, carry the standard tags, params and artifacts."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient

from ragen.config import load_config
from ragen.liveness import has_ended, process_tag
from ragen.tracking import (MlflowTracker, TrackingError, ensure_experiment, pipeline_run_id, preset_of,
                            resolve_tracking_uri)


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.delenv("RAGEN_PIPELINE_RUN", raising=False)
    uri = f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}"
    return uri, MlflowClient(tracking_uri=uri)


def config(uri, *overrides):
    return load_config("params.yaml", [f"tracking.uri={uri}", *overrides])


def runs(client, where=""):
    experiment = client.get_experiment_by_name("ragen").experiment_id
    return client.search_runs([experiment], where)


def test_stage_runs_of_one_config_nest_under_one_pipeline_run(store, tmp_path):
    uri, client = store
    cfg = config(uri)
    for stage in ("rollout", "update"):
        with MlflowTracker.for_stage(cfg, stage, root=tmp_path) as tracker:
            tracker.log_metrics({"val/bandit/success": 0.5}, step=3)
            tracker.log_table({"env": ["bandit"], "success": [True]}, "samples/t.json")
            tracker.log_to_pipeline({"val/bandit/success": 0.5})
    (parent,) = runs(client, "tags.`ragen.stage` = 'pipeline'")
    stages = runs(client, "tags.`ragen.stage` != 'pipeline'")
    assert {r.data.tags["ragen.stage"] for r in stages} == {"rollout", "update"}
    for run in stages:
        tags = run.data.tags
        assert tags["mlflow.parentRunId"] == parent.info.run_id
        assert tags["ragen.pipeline_run"] == parent.data.tags["ragen.pipeline_run"] == pipeline_run_id(cfg, tmp_path)
        assert tags["ragen.preset"] == "starpo_s" and tags["ragen.env"] == "bandit" and tags["ragen.seed"] == "0"
        assert "ragen.git_commit" in tags
        assert tags["ragen.cpu_kernels"] == torch.backends.cpu.get_cpu_capability()  # AVX2 on a pinned x86 machine
        assert tags["ragen.cpu_threads"] == str(torch.get_num_threads())
        assert run.data.params["filter.keep_ratio"] == "0.25" and run.data.params["train.env"] == "bandit"
        names = {a.path for a in client.list_artifacts(run.info.run_id)}
        assert {"config.yaml", "samples"} <= names
    assert parent.data.params["algo.clip_eps_high"] == "0.28"
    assert parent.data.metrics["val/bandit/success"] == 0.5


def test_a_users_mkl_branch_is_tagged_and_none_when_unset(store, tmp_path, monkeypatch):
    """MKL_CBWR changes MKL's matmul bytes (COMPATIBLE: the one branch Intel and AMD CPUs share), so runs say it."""
    uri, client = store
    monkeypatch.delenv("MKL_CBWR", raising=False)
    with MlflowTracker.for_stage(config(uri), "rollout", root=tmp_path):
        pass
    monkeypatch.setenv("MKL_CBWR", "COMPATIBLE")
    with MlflowTracker.for_stage(config(uri), "update", root=tmp_path):
        pass
    tags = {r.data.tags["ragen.stage"]: r.data.tags for r in runs(client, "tags.`ragen.stage` != 'pipeline'")}
    assert "ragen.mkl_cbwr" not in tags["rollout"] and tags["update"]["ragen.mkl_cbwr"] == "COMPATIBLE"


def test_another_config_is_another_pipeline_run_and_ablations_nest_one_level_up(store, tmp_path):
    uri, client = store
    with MlflowTracker(config(uri).tracking, stage="ablation", tags={"ragen.ablation_set": "clip"}) as set_run:
        pass
    for variant, eps in (("a", 0.2), ("b", 0.28)):
        cfg = config(uri, f"algo.clip_eps_high={eps}", "tracking.ablation_set=clip", f"tracking.variant={variant}",
                     f"tracking.parent_run_id={set_run.run_id}")
        with MlflowTracker.for_stage(cfg, "update", root=tmp_path):
            pass
    pipelines = runs(client, "tags.`ragen.stage` = 'pipeline'")
    assert len(pipelines) == 2
    assert {p.data.tags["mlflow.parentRunId"] for p in pipelines} == {set_run.run_id}
    assert {p.data.tags["ragen.variant"] for p in pipelines} == {"a", "b"}
    assert {p.data.tags["ragen.preset"] for p in pipelines} == {"custom", "starpo_s"}
    assert {p.data.tags["ragen.preset_nearest"] for p in pipelines} == {"starpo_s"}
    assert sorted(p.data.tags.get("ragen.preset_diff", "") for p in pipelines) == ["", "algo.clip_eps_high=0.2"]
    assert all(r.data.tags["ragen.ablation_set"] == "clip" for r in runs(client, "tags.`ragen.stage` = 'update'"))


def test_a_dvc_experiment_run_outside_the_workspace_logs_to_the_projects_store(monkeypatch, tmp_path):
    """`dvc exp run --temp` (or `--queue`) runs the stages in <project>/.dvc/tmp/exps/<...>/, which DVC deletes after:
    the default store is the project's mlruns/, not one inside the copy."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cfg = load_config("params.yaml").tracking
    project = tmp_path / "project"
    store = f"sqlite:///{project / 'mlruns' / 'mlflow.db'}"
    assert resolve_tracking_uri(cfg, project) == store
    assert resolve_tracking_uri(cfg, project / ".dvc/tmp/exps/standalone/tmpab12cd") == store  # --temp
    assert resolve_tracking_uri(cfg, project / ".dvc/tmp/exps/tmpab12cd") == store  # a queue's worker
    assert resolve_tracking_uri(cfg, project / "exps") == f"sqlite:///{project / 'exps/mlruns/mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://host:5000")  # a store named outside wins wherever it runs
    assert resolve_tracking_uri(cfg, project / ".dvc/tmp/exps/tmpab12cd") == "http://host:5000"


def test_preset_names_and_explicit_pipeline_ids(monkeypatch):
    assert preset_of(load_config("params.yaml", ["preset=starpo_grpo"])) == "starpo_grpo"
    assert preset_of(load_config("params.yaml", ["preset=starpo_ppo"])) == "starpo_ppo"
    assert preset_of(load_config("params.yaml", ["filter.keep_ratio=0.5"])) == "custom"
    assert preset_of(load_config("params.yaml", ["preset=starpo_grpo", "algo.grpo_by_std=false"])) == "custom"
    assert preset_of(load_config("params.yaml", ["preset=starpo_s", "algo.first_action_bonus=entropy"])) == "custom"
    assert preset_of(load_config("params.yaml", ["preset=starpo_s", "algo.gamma=0.99"])) == "custom"
    cfg = load_config("params.yaml", [])
    monkeypatch.setenv("RAGEN_PIPELINE_RUN", "nightly-1")
    assert pipeline_run_id(cfg, None) == "nightly-1"
    assert pipeline_run_id(load_config("params.yaml", ["tracking.pipeline_run=x"]), None) == "x"


def test_unreachable_server_fails_before_any_work():
    cfg = load_config("params.yaml", ["tracking.uri=http://127.0.0.1:9"])
    with pytest.raises(TrackingError, match="did not answer"):
        MlflowTracker.for_stage(cfg, "update").__enter__()


@pytest.mark.parametrize("uri, said", [
    ("foo://x", "UnsupportedModelRegistryStoreURIException: Model registry functionality is unavailable; got "
                "unsupported URI 'foo://x'"),
    ("{tmp}/store", "MlflowException: The filesystem tracking backend (e.g., './mlruns') is in maintenance mode"),
    ("sqlite://relative.db", "ArgumentError: Invalid SQLite URL: sqlite://relative.db"),
])
def test_a_store_mlflow_cannot_open_is_named_with_the_fix(tmp_path, uri, said):
    """Before: MLflow's traceback at the start of every stage (a typo in tracking.uri, a bare path)."""
    uri = uri.format(tmp=tmp_path)
    cfg = load_config("params.yaml", [f"tracking.uri={uri}"])
    with pytest.raises(TrackingError) as error:
        MlflowTracker.for_stage(cfg, "update", root=tmp_path).__enter__()
    assert str(error.value).startswith(f"tracking store {uri}: MLflow cannot open it ({said}")
    assert str(error.value).endswith("); set tracking.uri in params.yaml (or MLFLOW_TRACKING_URI) to a store it "
                                     "opens, as sqlite:////abs/path/mlflow.db or http://host:5000; empty means the "
                                     "local mlruns/")
    assert list(tmp_path.iterdir()) == []


OPENS_AND_DIES = """
import os, signal, sys, time
from ragen.config import load_config
from ragen.liveness import has_ended, process_tag
from ragen.tracking import MlflowTracker
cfg = load_config("params.yaml", [f"tracking.uri={sys.argv[1]}"])
with MlflowTracker.for_stage(cfg, "update") as tracker:
    tracker.log_metrics({"actor/pg_loss": 0.1}, step=1)
    print(tracker.run_id, flush=True)
    if sys.argv[2] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)  # as the kernel's out-of-memory killer ends it: no cleanup runs
    time.sleep(600)
"""


def test_a_run_left_running_by_a_killed_process_is_closed_by_the_next_run(store, tmp_path):
    uri, client = store
    root = Path(__file__).resolve().parents[1]
    script = tmp_path / "opens_and_dies.py"
    script.write_text(OPENS_AND_DIES)

    def opener(how):
        return subprocess.Popen([sys.executable, str(script), uri, how], cwd=root, stdout=subprocess.PIPE, text=True,
                                env={**os.environ, "PYTHONPATH": str(root)})

    ensure_experiment(client, "ragen", uri)  # the store's tables and experiment exist before either process opens it
    killed, alive = opener("kill"), opener("live")
    try:
        killed_run, alive_run = killed.stdout.readline().strip(), alive.stdout.readline().strip()
        assert killed.wait(timeout=60) == -9
        assert client.get_run(killed_run).info.status == "RUNNING"  # what the kill left
        with MlflowTracker.for_stage(config(uri), "evaluate", root=tmp_path) as tracker:
            pass
        closed = client.get_run(killed_run)
        assert closed.info.status == "KILLED" and closed.info.end_time is not None
        assert "ended without recording the run's end, killed outright" in closed.data.tags["ragen.ended"]
        assert client.get_run(alive_run).info.status == "RUNNING"  # its process still runs: left alone
        assert client.get_run(tracker.run_id).info.status == "FINISHED"
    finally:
        alive.kill()
        alive.wait()


def test_a_process_has_ended_when_its_pid_is_gone_or_started_again_and_never_on_another_host():
    own = process_tag()
    host, pid, started = own.rsplit("/", 2)
    assert pid == str(os.getpid()) and started.isdigit() and not has_ended(own)
    assert has_ended(f"{host}/{pid}/{int(started) + 1}")  # the pid, but a process started at another time
    child = subprocess.Popen(["sleep", "30"])
    tag = process_tag(child.pid)
    assert not has_ended(tag)
    child.kill()
    child.wait()
    assert has_ended(tag)
    assert not has_ended(f"another-host-{host}/{child.pid}/1") and not has_ended("not a tag")


def test_a_process_that_loses_the_race_to_create_the_experiment_reads_the_winners(store, monkeypatch):
    uri, client = store
    winner = ensure_experiment(client, "ragen", uri)
    late = MlflowClient(tracking_uri=uri)
    looked = []
    # the other process creates it between this one's look and its create
    monkeypatch.setattr(late, "get_experiment_by_name", lambda name: looked.append(name) or (
        None if len(looked) == 1 else client.get_experiment_by_name(name)))
    assert ensure_experiment(late, "ragen", uri) == winner and looked == ["ragen", "ragen"]
