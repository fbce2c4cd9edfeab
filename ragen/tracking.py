"""MLflow tracking: the only module that imports mlflow.

A stage opens one run with `MlflowTracker(cfg.tracking, stage=...)` used as a context manager; the library
returns plain metric dicts and the flow logs them with `tracker.log_metrics(metrics, step)`. `NullTracker` has the
same methods and does nothing, so code never branches on whether tracking is on.

The default store is the local `mlruns/` folder: `sqlite:///<root>/mlruns/mlflow.db` with artifacts under
`mlruns/artifacts/`. `tracking.uri` in params.yaml, or else $MLFLOW_TRACKING_URI, replaces it.
"""

from __future__ import annotations

import logging
import os
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
logging.getLogger("alembic").setLevel(logging.WARNING)

from mlflow.entities import Metric, Param, RunTag  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402

from ragen.config import TrackingConfig  # noqa: E402

MAX_PARAM_CHARS = 6000
PASSTHROUGH_ENV_TAGS = {  # environment variable -> tag
    "RAGEN_PIPELINE_RUN_ID": "ragen.pipeline_run",
    "RAGEN_ABLATION_SET": "ragen.ablation_set",
    "DVC_STAGE": "dvc.stage",
    "DVC_EXP_NAME": "dvc.exp_name",
    "DVC_EXP_BASELINE_REV": "dvc.exp_baseline_rev",
}


class TrackingError(RuntimeError):
    """The tracking store cannot be used; raised before any work starts."""


def resolve_tracking_uri(cfg: TrackingConfig, root: Path) -> str:
    """params `tracking.uri` > $MLFLOW_TRACKING_URI > sqlite in `<root>/mlruns/`."""
    if cfg.uri:
        return cfg.uri
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    return f"sqlite:///{(root / 'mlruns' / 'mlflow.db').resolve()}"


def check_reachable(uri: str, timeout_s: float = 5.0) -> None:
    """Fail at start, not after an hour of training, when a tracking server does not answer."""
    if uri.startswith(("http://", "https://")):
        try:
            with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout_s) as response:
                response.read()
        except (urllib.error.URLError, OSError) as error:
            raise TrackingError(
                f"MLflow tracking server {uri} did not answer ({error}); start it, or set tracking.uri in "
                "params.yaml (or MLFLOW_TRACKING_URI) to a reachable store; empty means the local mlruns/"
            ) from None
    elif uri.startswith("sqlite:///"):
        Path(uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)


def git_commit(root: Path) -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 else "unknown"


class MlflowTracker:
    """One MLflow run for one stage, tagged so that ablations and pipeline runs can be found and compared."""

    def __init__(self, cfg: TrackingConfig, *, stage: str, params: dict[str, Any] | None = None,
                 tags: dict[str, str] | None = None, root: Path | None = None) -> None:
        self.root = (root or Path.cwd()).resolve()
        self.uri = resolve_tracking_uri(cfg, self.root)
        self.experiment = cfg.experiment
        self.stage = stage
        self.params = params or {}
        self.tags = tags or {}
        self.run_id: str | None = None
        self.client: MlflowClient | None = None

    def __enter__(self) -> MlflowTracker:
        check_reachable(self.uri)
        self.client = MlflowClient(tracking_uri=self.uri)
        experiment = self.client.get_experiment_by_name(self.experiment)
        if experiment is None:
            location = None  # a local sqlite store keeps its artifacts beside it, e.g. mlruns/artifacts/
            if self.uri.startswith("sqlite:///"):
                location = (Path(self.uri.removeprefix("sqlite:///")).parent / "artifacts").as_uri()
            experiment_id = self.client.create_experiment(self.experiment, artifact_location=location)
        else:
            experiment_id = experiment.experiment_id
        tags = {"ragen.stage": self.stage, "ragen.git_commit": git_commit(self.root), **self.tags}
        tags.update({tag: os.environ[var] for var, tag in PASSTHROUGH_ENV_TAGS.items() if os.environ.get(var)})
        run = self.client.create_run(experiment_id, tags=tags, run_name=f"{self.stage}-{time.strftime('%Y%m%d-%H%M%S')}")
        self.run_id = run.info.run_id
        params = [Param(key, str(value)[:MAX_PARAM_CHARS]) for key, value in self.params.items()]
        for start in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(self.run_id, params=params[start : start + 100])
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self.client is not None and self.run_id is not None:
            self.client.set_terminated(self.run_id, status="FAILED" if exc_type else "FINISHED")

    def log_metrics(self, metrics: dict[str, float], step: int = 0) -> None:
        now = int(time.time() * 1000)
        batch = [Metric(key, float(value), now, step) for key, value in metrics.items()]
        for start in range(0, len(batch), 1000):
            self.client.log_batch(self.run_id, metrics=batch[start : start + 1000])

    def log_dict(self, obj: dict[str, Any], name: str) -> None:
        """A small artifact (json or yaml by the name's suffix)."""
        self.client.log_dict(self.run_id, obj, name)

    def set_tags(self, tags: dict[str, str]) -> None:
        self.client.log_batch(self.run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])


class NullTracker:
    """Same interface as MlflowTracker, records nothing."""

    run_id = None

    def __enter__(self) -> NullTracker:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        return None

    def log_metrics(self, metrics: dict[str, float], step: int = 0) -> None:
        return None

    def log_dict(self, obj: dict[str, Any], name: str) -> None:
        return None

    def set_tags(self, tags: dict[str, str]) -> None:
        return None


__all__ = ["MlflowTracker", "NullTracker", "TrackingError", "resolve_tracking_uri"]
