"""`python -m flows.<stage>` (dvc.yaml's commands): bad input ends in one line naming the problem, exit code 2."""

import logging
import os
import signal
import subprocess
import sys

import pytest

from flows.base import base
from flows.common import QuietInputErrors, run_stage
from flows.envgen import envgen
from flows.evaluate import evaluate
from flows.filter import filter_rollouts
from processes import left_running, own_session, wait_until
from ragen.fileio import StageFileError


def run(stage_flow, monkeypatch, *argv):
    monkeypatch.setattr(sys, "argv", [stage_flow.name, *argv])
    with pytest.raises(SystemExit) as exit_info:
        run_stage(stage_flow)
    return exit_info.value.code


def test_a_bad_config_value_stops_the_stage_before_it_starts(project, monkeypatch, capsys):
    (project / "params.yaml").write_text("eval:\n  episodes: 8\n")
    assert run(evaluate, monkeypatch, "eval.against_base=maybe") == 2
    err = capsys.readouterr().err
    assert err == "evaluate: override 'eval.against_base=maybe': bad value for 'eval.against_base': Value 'maybe' is " \
                  "not a valid bool (type str)\n"
    assert run(evaluate, monkeypatch, "eval.episodez=8") == 2
    assert ("evaluate: override 'eval.episodez=8': unknown key 'eval.episodez' (did you mean 'eval.episodes'?)"
            in capsys.readouterr().err)
    (project / "params.yaml").unlink()
    assert run(evaluate, monkeypatch) == 2
    assert capsys.readouterr().err.startswith("evaluate: params.yaml: no such params file")
    assert not (project / "mlruns").exists()  # nothing ran, nothing was tracked


def test_help_says_what_the_stage_does_and_other_arguments_are_named(project, monkeypatch, capsys):
    """Before: `python -m flows.evaluate --help` said "expected key=value overrides", exit code 1."""
    (project / "params.yaml").write_text("eval:\n  episodes: 8\n")
    assert run(evaluate, monkeypatch, "--help") == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m flows.evaluate [key=value ...]\n\nStage evaluate: the trained policy on "
                          "the val and test splits")
    assert "`python -m flows.run evaluate`" in out
    assert run(evaluate, monkeypatch, "eval.episodes=4", "episodes") == 2
    assert capsys.readouterr().err == ("evaluate: expected key=value overrides (e.g. train.steps=3), got ['episodes']; "
                                       "--help says what the stage does\n")
    assert not (project / "mlruns").exists()


def test_a_damaged_input_ends_with_the_file_and_the_fix(prefect_harness, project, monkeypatch, capsys, caplog):
    """Prefect's own record of the failed flow run stays, without its traceback."""
    (project / "params.yaml").write_text("filter:\n  keep_ratio: 0.5\n")
    (project / "data" / "rollouts").mkdir(parents=True)
    (project / "data" / "rollouts" / "base.parquet").write_text("not parquet")
    assert run(filter_rollouts, monkeypatch) == 2
    err = capsys.readouterr().err
    failed = [r for r in caplog.records if r.name == "prefect.flow_runs" and "StageFileError(" in r.getMessage()]
    assert len(failed) == 1 and failed[0].exc_info is None and "Traceback" not in caplog.text
    last = err.strip().splitlines()[-1]
    assert last.startswith("filter: data/rollouts/base.parquet: not a readable parquet file")
    assert last.endswith("delete it and run `dvc repro` to rebuild it")
    assert not (project / "data" / "rollouts" / "filtered.parquet").exists()


def test_a_model_path_it_cannot_use_ends_with_the_path(prefect_harness, project, monkeypatch, capsys):
    (project / "params.yaml").write_text("envs:\n  tags: [bandit]\n  train_size: 4\n  val_size: 2\n  test_size: 2\n")
    envgen(params=str(project / "params.yaml"))
    missing = project / "no_such_model"
    assert run(base, monkeypatch, "model.source=hf", f"model.path={missing}") == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == f"base: model path {missing} does not exist; set model.path to a local checkpoint directory"
    assert not (project / "models").exists()
    template = project / "no_such_template.jinja"
    assert run(base, monkeypatch, "model.source=hf", f"model.path={project}", f"model.chat_template={template}") == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == (f"base: model.chat_template: cannot read {template} (FileNotFoundError); set it to a Jinja chat "
                    "template file, or leave it empty for the checkpoint's own")
    assert not (project / "models").exists()


def test_cuda_where_torch_sees_no_gpu_ends_with_the_fix(prefect_harness, project, monkeypatch, capsys):
    """`model.device=cuda` on a machine without one (our pinned torch is a CPU build): before, torch's AssertionError
    traceback from the first `.to()`, after the flow had started."""
    import torch

    from ragen.policy.model import build_tiny_model, save_model
    from ragen.policy.tokenizer import env_corpus, train_tokenizer

    (project / "params.yaml").write_text("envs:\n  tags: [bandit]\n  train_size: 4\n  val_size: 2\n  test_size: 2\n")
    envgen(params=str(project / "params.yaml"))
    tokenizer = train_tokenizer(env_corpus(["bandit"], episodes_per_env=4, seed=0), vocab_size=300)
    model = build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                             intermediate_size=64, max_positions=256, seed=0)
    save_model(model, project / "ckpt", tokenizer=tokenizer)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # so on a GPU machine too
    assert run(base, monkeypatch, "model.source=hf", f"model.path={project / 'ckpt'}", "model.device=cuda") == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("base: model.device=cuda: this torch (")
    assert last.endswith("set model.device=auto (a GPU where torch sees one) or cpu, or run on a machine with a GPU "
                         "and a CUDA build of torch")
    assert not (project / "models").exists()


def test_a_tracking_store_it_cannot_use_ends_with_the_uri(prefect_harness, project, monkeypatch, capsys):
    """Before: TrackingError's traceback (a server that does not answer), or MLflow's (a store it cannot open)."""
    (project / "params.yaml").write_text("envs:\n  tags: [bandit]\n  train_size: 4\n  val_size: 2\n  test_size: 2\n")
    assert run(envgen, monkeypatch, "tracking.uri=http://127.0.0.1:9") == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("envgen: MLflow tracking server http://127.0.0.1:9 did not answer")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "foo://x")
    assert run(envgen, monkeypatch) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("envgen: tracking store foo://x: MLflow cannot open it (")
    assert not (project / "data").exists()


HOLD = """
import time
from flows.common import exclusively, stage_lock
with exclusively(stage_lock("envgen"), "stage envgen"):
    print("held", flush=True)
    time.sleep(120)
"""


def test_a_stage_already_running_is_not_run_again_beside_it(prefect_harness, project, monkeypatch, capsys):
    """The same stage started while it runs (another terminal, `dvc repro` beside a direct run) ends at once with
    the running one's process and writes nothing; once that process is gone, killed or not, the stage runs."""
    (project / "params.yaml").write_text("envs:\n  tags: [bandit]\n  train_size: 4\n  val_size: 2\n  test_size: 2\n")
    holder = subprocess.Popen([sys.executable, "-c", HOLD], cwd=project, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        assert run(envgen, monkeypatch) == 2
    finally:
        holder.kill()
        holder.wait()
    assert capsys.readouterr().err.strip() == (f"envgen: stage envgen is in use by another run (process {holder.pid}); "
                                               f"wait for it to end, or stop it (`kill {holder.pid}`)")
    assert not (project / "data").exists() and not (project / "mlruns").exists()
    monkeypatch.setattr(sys, "argv", ["envgen"])
    run_stage(envgen)  # the killed holder's lock went with its process
    assert (project / "data" / "envs").is_dir()
    assert (project / ".tmp" / "locks" / "envgen.lock").read_text() == f"{os.getpid()}\n"


def test_only_input_errors_lose_their_traceback():
    quiet = QuietInputErrors((StageFileError,))

    def record(error):
        try:
            raise error
        except Exception:
            return logging.LogRecord("prefect.flow_runs", logging.ERROR, __file__, 1, "failed", None, sys.exc_info())

    bug, damaged = record(KeyError("a bug")), record(StageFileError("x.parquet: damaged"))
    assert quiet.filter(bug) and quiet.filter(damaged)
    assert bug.exc_info[0] is KeyError and damaged.exc_info is None


SLEEPER = """
import pathlib, time
from prefect import flow
from flows.common import run_stage
from ragen.config import load_config
from ragen.fileio import staged_dir
from ragen.tracking import MlflowTracker

@flow(name="sleeper")
def sleeper(overrides=None):
    cfg = load_config("params.yaml", overrides or [])
    with MlflowTracker.for_stage(cfg, "sleeper"), staged_dir("out") as staging:
        (staging / "half").write_text("written")
        pathlib.Path("inside").write_text("1")
        time.sleep(300)

if __name__ == "__main__":
    run_stage(sleeper)
"""


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_a_stopped_stage_ends_through_its_cleanups(tmp_path, signum):
    """Ctrl-C (to the terminal's process group), `kill` or a closed terminal end a stage run directly through its
    cleanups: exit code 128 + N (after Ctrl-C with one line that says so), its MLflow run KILLED, no staging folder
    of a half-written output left beside it, and no Prefect server left running, with nothing failing to reach one.
    Before: a traceback and exit code 1 under Ctrl-C, FAILED under SIGTERM, and RUNNING for good under SIGHUP,
    which killed the process on the spot."""
    from mlflow.tracking import MlflowClient

    (tmp_path / "params.yaml").write_text("envs:\n  val_seed: 123\n")
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    argv = [sys.executable, "sleeper.py"]
    with own_session(argv, tmp_path, tmp_path / "prefect", stderr=subprocess.PIPE, text=True) as stage:
        wait_until((tmp_path / "inside").exists, stage, 120, lambda: "the stage never started")
        assert len(left_running(tmp_path / "prefect")) >= 2  # the stage and its Prefect server
        if signum == signal.SIGINT:
            os.killpg(stage.pid, signum)  # as the terminal sends it
        else:
            stage.send_signal(signum)
        _, err = stage.communicate(timeout=60)
        assert stage.returncode == 128 + signum, err[-3000:]
    if signum == signal.SIGINT:
        assert err.splitlines()[-1] == "sleeper: interrupted; nothing half-written is left, run it again"
    assert "Traceback" not in err and "connection attempts failed" not in err, err[-3000:]
    assert not left_running(tmp_path / "prefect")
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.*"))
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("ragen").experiment_id], "tags.`ragen.stage` = 'sleeper'")
    assert [run.info.status for run in runs] == ["KILLED"]
