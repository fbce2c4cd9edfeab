"""Prefect flows, one per pipeline stage: thin glue that reads params, calls `ragen`, writes the stage's files
and owns the stage's MLflow run. Imported before Prefect so that its state stays inside the project."""

import os
from pathlib import Path

_ROOT = Path.cwd()
for _key, _value in {
    "PREFECT_HOME": str(_ROOT / ".prefect"),
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_LOGGING_LEVEL": "WARNING",
    "PREFECT_SERVER_LOGGING_LEVEL": "ERROR",
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DVC_NO_ANALYTICS": "1",
}.items():
    os.environ.setdefault(_key, _value)

import ragen  # noqa: E402,F401  (pins torch's CPU kernels before anything loads torch: ragen/kernels.py)
