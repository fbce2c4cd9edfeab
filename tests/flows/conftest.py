"""Flows run for real on an ephemeral Prefect test server (one per session) and a local MLflow store per test."""

import os

import pytest


@pytest.fixture(scope="session")
def prefect_harness(tmp_path_factory):
    os.environ.setdefault("PREFECT_HOME", str(tmp_path_factory.mktemp("prefect_home")))
    os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    os.environ["PREFECT_LOGGING_LEVEL"] = "WARNING"
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120), temporary_settings(
        updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}
    ):
        yield


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A scratch project folder as the working directory, with its own mlruns/ store."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return tmp_path
