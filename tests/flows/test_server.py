"""flows.server: one local Prefect server for a command (what `make run` wraps `dvc repro` in)."""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import psutil
import pytest

from flows.server import _healthy, main, prefect_api
from processes import own_session, wait_until

ROOT = Path(__file__).resolve().parents[2]


def test_command_runs_against_a_started_server_and_keeps_its_exit_code(tmp_path, monkeypatch):
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "prefect"))
    probe = ("import os, urllib.request; url = os.environ['PREFECT_API_URL']; "
             "assert urllib.request.urlopen(url + '/health').read() == b'true'; "
             "assert os.path.exists(os.environ['RAGEN_STAGE_SERVER']); raise SystemExit(3)")
    assert main(["--", sys.executable, "-c", probe]) == 3
    assert (tmp_path / "prefect" / "server.log").exists()
    assert (tmp_path / "prefect" / "warm_stage_server.log").exists()


def test_a_configured_server_is_used_as_it_is(monkeypatch):
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:9/api")
    code = "import os; raise SystemExit(0 if os.environ['PREFECT_API_URL'] == 'http://127.0.0.1:9/api' else 1)"
    assert main([sys.executable, "-c", code]) == 0
    assert main([]) == 2


def test_a_command_that_is_not_there_is_one_line_with_a_shells_exit_code(monkeypatch, capsys):
    """Before: Popen's FileNotFoundError traceback (`python -m flows.server -- dvc repro` without .venv/bin on
    PATH)."""
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:9/api")
    assert main(["--", "no-such-command-here", "repro"]) == 127
    assert capsys.readouterr().err.endswith("flows.server: no-such-command-here: command not found; give its path, "
                                            "or put its folder on PATH (`make run` puts .venv/bin there)\n")


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_terminated_run_ends_its_command_stage_and_servers(tmp_path, signum):
    """`kill`, a batch system's time limit or a closed terminal: the command (here the stage client of dvc.yaml),
    the stage running in the warm server and both servers end, and the exit code is a shell's 128 + N. Before,
    the command and both servers ran on without the wrapper."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "sleeper.py").write_text(
        "import os, pathlib, time\npathlib.Path('stage.pid').write_text(str(os.getpid()))\ntime.sleep(300)\n")
    argv = [sys.executable, "-m", "flows.server", "--", sys.executable, "-m", "flows.run", "pkg.sleeper"]
    with own_session(argv, tmp_path, tmp_path / "prefect") as wrapper:
        wait_until((tmp_path / "stage.pid").exists, wrapper, 120, lambda: "the stage never started")
        time.sleep(0.2)  # the pid is written before the sleep starts
        stage = psutil.Process(int((tmp_path / "stage.pid").read_text()))
        started = [stage, *psutil.Process(wrapper.pid).children(recursive=True)]
        assert len(started) >= 4  # the stage, its client, the warm stage server and the Prefect server
        wrapper.send_signal(signum)
        assert wrapper.wait(timeout=60) == 128 + signum
        gone, alive = psutil.wait_procs(started, timeout=10)
        assert not alive, alive


@pytest.mark.slow
def test_ctrl_c_leaves_the_prefect_server_up_until_the_command_has_ended(tmp_path):
    """Ctrl-C reaches the terminal's whole process group; a stage still reports its end to the Prefect server
    then. The server runs in its own session and stops only after the command: before, it stopped with the
    Ctrl-C, and a stage under `make run` hung about a minute on the gone server before failing."""
    command = ("import os, pathlib, time, urllib.request\n"
               "pathlib.Path('started').write_text('1')\n"
               "try:\n    time.sleep(300)\n"
               "except KeyboardInterrupt:\n    time.sleep(2)  # a stage's cleanups\n"
               "    url = os.environ['PREFECT_API_URL'] + '/health'\n"
               "    raise SystemExit(7 if urllib.request.urlopen(url, timeout=5).read() == b'true' else 1)\n")
    argv = [sys.executable, "-m", "flows.server", "--", sys.executable, "-c", command]
    with own_session(argv, tmp_path, tmp_path / "prefect") as wrapper:
        wait_until((tmp_path / "started").exists, wrapper, 120, lambda: "the command never started")
        os.killpg(wrapper.pid, signal.SIGINT)  # what Ctrl-C at the terminal sends
        assert wrapper.wait(timeout=60) == 7


def test_a_flow_run_directly_reports_to_a_local_server_that_ends_with_the_block(tmp_path, monkeypatch):
    """`prefect_api` (stages and `ragen` commands run directly): the configured API when there is one, else a
    local server of its own session for the block, which gets the flow's runs and is gone after it."""
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    @flow(name="probe")
    def probe():
        return PREFECT_API_URL.value()

    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "prefect"))
    with temporary_settings(updates={PREFECT_API_URL: "http://127.0.0.1:9/api"}), prefect_api():
        assert PREFECT_API_URL.value() == "http://127.0.0.1:9/api"
    with temporary_settings(restore_defaults={PREFECT_API_URL}):
        with prefect_api():
            url = PREFECT_API_URL.value()
            assert url and _healthy(url)
            (server,) = [p for p in psutil.Process().children() if str(urlsplit(url).port) in p.cmdline()]
            assert os.getsid(server.pid) == server.pid  # a session of its own: Ctrl-C at the terminal misses it
            assert probe() == url
            with get_client(sync_client=True) as client:  # a fresh PREFECT_HOME: only this run
                assert [f.name for f in client.read_flows()] == ["probe"] and len(client.read_flow_runs()) == 1
        assert not _healthy(url) and not server.is_running()


def test_a_local_server_that_does_not_start_leaves_the_run_to_prefects_own(tmp_path, monkeypatch, capsys):
    """A port taken between choosing and binding it (or a locked database): the run goes on, with a line that says
    so, on Prefect's temporary server, instead of failing."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    import flows.server

    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "prefect"))
    with socket.socket() as taken, temporary_settings(restore_defaults={PREFECT_API_URL}):
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        monkeypatch.setattr(flows.server, "free_port", lambda: taken.getsockname()[1])
        with prefect_api():
            assert not PREFECT_API_URL.value()
    err = capsys.readouterr().err
    assert "the local Prefect server did not start; see" in err and "uses Prefect's temporary server instead" in err


RUNS_AND_DIES = """
import os, signal, sys, time
from prefect import flow
from flows.server import prefect_api

@flow(name="runs_and_dies")
def probe(how):
    print("running", flush=True)
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)  # as the kernel's out-of-memory killer ends it: no cleanup runs
    time.sleep(600)

with prefect_api():
    probe(sys.argv[1])
"""


def test_a_flow_run_left_running_by_a_killed_process_is_marked_crashed_by_the_next_run(prefect_harness, tmp_path):
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName
    from prefect.settings import PREFECT_API_URL

    from flows.server import PROCESS_TAG
    from ragen.liveness import process_tag

    @flow(name="next")
    def next_run():
        return 1

    script = tmp_path / "runs_and_dies.py"
    script.write_text(RUNS_AND_DIES)
    env = os.environ | {"PREFECT_API_URL": PREFECT_API_URL.value(), "PYTHONPATH": str(ROOT)}
    killed, alive = (subprocess.Popen([sys.executable, str(script), how], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                      text=True) for how in ("kill", "live"))
    try:
        assert killed.stdout.readline() == alive.stdout.readline() == "running\n"
        assert killed.wait(timeout=60) == -9
        with get_client(sync_client=True) as client:
            def state_of(pid):  # the session's server holds every test's runs: this flow's only
                runs = client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=["runs_and_dies"])))
                (run,) = [r for r in runs if f"/{pid}/" in " ".join(r.tags)]
                return client.read_flow_run(run.id).state
            assert state_of(killed.pid).type.value == "RUNNING"  # what the kill left
            with prefect_api():
                done = next_run(return_state=True)
            crashed = state_of(killed.pid)
            assert crashed.type.value == "CRASHED" and "ended without reporting the run's end" in crashed.message
            assert state_of(alive.pid).type.value == "RUNNING"  # its process still runs: left alone
            mine = client.read_flow_run(done.state_details.flow_run_id)
            assert mine.state.type.value == "COMPLETED" and PROCESS_TAG + process_tag() in mine.tags
    finally:
        alive.kill()
        alive.wait()
