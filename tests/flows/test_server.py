"""flows.server: one local Prefect server for a command (what `make run` wraps `dvc repro` in)."""

import sys

from flows.server import main


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
