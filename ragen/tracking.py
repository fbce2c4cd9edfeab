"""MLflow tracking: the only module that imports mlflow.

A stage opens one run with `MlflowTracker.for_stage(cfg, "stage")` used as a context manager; the library
returns plain metric dicts and the flow logs them with `tracker.log_metrics(metrics, step)`. `NullTracker` has the
same methods and does nothing, so code never branches on whether tracking is on.

Runs are found by tags: ragen.stage, ragen.preset (the preset run exactly, or custom), ragen.preset_nearest and
ragen.preset_diff (the preset with the fewest differing algo and filter keys, and the run's values of those keys;
ragen.presets.nearest_preset), ragen.env, ragen.seed, ragen.pipeline_run, ragen.ablation_set, ragen.variant,
ragen.git_commit, and dvc.exp_name under `dvc exp run`. The stage runs of one pipeline run nest
under one parent run (ragen.stage = pipeline) that carries the same params and tags, and itself under
`tracking.parent_run_id` when that is set (the nightly run). A pipeline run is identified by `tracking.pipeline_run`, or
else by a digest of the resolved config and the git commit, so the stages of one `dvc repro` find the same parent.

The default store is the local `mlruns/` folder: `sqlite:///<root>/mlruns/mlflow.db` with artifacts under
`mlruns/artifacts/`. `tracking.uri` in params.yaml, or else $MLFLOW_TRACKING_URI, replaces it.

A run's end is recorded by its process (FINISHED, FAILED or KILLED). A process killed outright (signal 9: the kernel's
out-of-memory killer) records nothing, so each run is tagged ragen.process (host, pid and start time), and each new
run first closes the runs of its experiment on this host whose process has ended: they read KILLED, with the tag
ragen.ended saying why (`close_ended_runs`).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
logging.getLogger("alembic").setLevel(logging.WARNING)

from mlflow.entities import Metric, Param, RunTag  # noqa: E402
from mlflow.exceptions import MlflowException  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402

from ragen.config import Config, TrackingConfig, config_digest, flatten, to_dict  # noqa: E402
from ragen.kernels import in_effect  # noqa: E402
from ragen.liveness import has_ended, host, process_tag  # noqa: E402
from ragen.presets import nearest_preset  # noqa: E402

MAX_PARAM_CHARS = 6000
PASSTHROUGH_ENV_TAGS = {  # environment variable -> tag
    "DVC_STAGE": "dvc.stage",
    "DVC_EXP_NAME": "dvc.exp_name",
    "DVC_EXP_BASELINE_REV": "dvc.exp_baseline_rev",
    "MKL_CBWR": "ragen.mkl_cbwr",  # MKL's reproducibility branch where the user set one (COMPATIBLE: across vendors)
}


class TrackingError(RuntimeError):
    """The tracking store cannot be used; raised before any work starts."""


def resolve_tracking_uri(cfg: TrackingConfig, root: Path) -> str:
    """params `tracking.uri` > $MLFLOW_TRACKING_URI > sqlite in `<store_root(root)>/mlruns/`."""
    if cfg.uri:
        return cfg.uri
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    return f"sqlite:///{store_root(root.resolve()) / 'mlruns' / 'mlflow.db'}"


def store_root(root: Path) -> Path:
    """The folder whose `mlruns/` holds the runs of a stage run in `root`: `root` itself, or for a DVC experiment
    run outside the workspace (`dvc exp run --temp`, or queued: `--queue`, then `dvc queue start`) the project it
    was started from. DVC runs those in a copy under `<project>/.dvc/tmp/exps/` and deletes it afterwards, with any
    store inside."""
    parts = root.parts
    for i in range(len(parts) - 2):
        if parts[i:i + 3] == (".dvc", "tmp", "exps"):
            return Path(*parts[:i])
    return root


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


def open_store(uri: str, experiment: str) -> tuple[MlflowClient, str]:
    """A client of the store at `uri` and the id of `experiment` there (`ensure_experiment`), before any work; a
    TrackingError naming the URI and the fix when a server does not answer (`check_reachable`) or MLflow cannot open
    the store: an unknown scheme, a bare path (MLflow's file store, which it now refuses), a malformed sqlite URL, a
    database whose driver is not installed. Before, those ended each stage in MLflow's traceback."""
    check_reachable(uri)
    try:
        client = MlflowClient(tracking_uri=uri)
        return client, ensure_experiment(client, experiment, uri)
    except Exception as error:  # noqa: BLE001  (whatever the store's backend raises on opening)
        said = str(error).strip().splitlines()[0].split(". ")[0] if str(error).strip() else ""
        raise TrackingError(
            f"tracking store {uri}: MLflow cannot open it ({type(error).__name__}{': ' + said if said else ''}); set "
            "tracking.uri in params.yaml (or MLFLOW_TRACKING_URI) to a store it opens, as "
            "sqlite:////abs/path/mlflow.db or http://host:5000; empty means the local mlruns/") from None


def git_commit(root: Path) -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 else "unknown"


def preset_of(config: Config) -> str:
    """The name of the preset that the config runs exactly (sections algo and filter; ragen.presets), or custom."""
    name, diff = nearest_preset(config)
    return "custom" if diff else name


def pipeline_run_id(config: Config, root: Path) -> str:
    """`tracking.pipeline_run`, $RAGEN_PIPELINE_RUN, or a digest of the resolved config (tracking aside) and the
    git commit."""
    if config.tracking.pipeline_run or os.environ.get("RAGEN_PIPELINE_RUN"):
        return config.tracking.pipeline_run or os.environ["RAGEN_PIPELINE_RUN"]
    return f"p{config_digest(config, git_commit(root))[:12]}"


def run_tags(config: Config) -> dict[str, str]:
    """The tags every run of a pipeline carries (empty ones left out)."""
    t = config.tracking
    nearest, diff = nearest_preset(config)
    tags = {"ragen.preset": "custom" if diff else nearest, "ragen.preset_nearest": nearest,
            "ragen.preset_diff": ", ".join(diff), "ragen.env": config.train.env, "ragen.seed": str(config.train.seed),
            "ragen.algo": config.algo.advantage, "ragen.keep_ratio": str(config.filter.keep_ratio),
            "ragen.model_source": config.model.source, "ragen.ablation_set": t.ablation_set, "ragen.variant": t.variant}
    return {k: v for k, v in tags.items() if v}


def ensure_experiment(client: MlflowClient, name: str, uri: str) -> str:
    """The experiment's id, created if the store has none of that name. Two processes that start on a new store at
    once (an ablation set's Dask workers) may both try to create it; the one that loses reads the winner's."""
    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        return experiment.experiment_id
    location = None  # a local sqlite store keeps its artifacts beside it, e.g. mlruns/artifacts/
    if uri.startswith("sqlite:///"):
        location = (Path(uri.removeprefix("sqlite:///")).parent / "artifacts").as_uri()
    try:  # the UI opens a "model training" experiment on its runs and charts (not the GenAI traces overview)
        return client.create_experiment(name, artifact_location=location,
                                        tags={"mlflow.experimentKind": "custom_model_development"})
    except MlflowException:
        experiment = client.get_experiment_by_name(name)
        if experiment is None:
            raise
        return experiment.experiment_id


def close_ended_runs(client: MlflowClient, experiment_id: str) -> list[str]:
    """Close the runs of the experiment left RUNNING on this host by a process that has ended without recording
    their end (`ragen.liveness.has_ended`): each reads KILLED from now, tagged ragen.ended. Their ids."""
    name = host().replace("'", "")  # a quote would end the filter's string (no host name has one)
    left = client.search_runs([experiment_id], max_results=1000, filter_string=(
        f"attributes.status = 'RUNNING' and tags.`ragen.process` LIKE '{name}/%'"))
    closed = []
    for run in left:
        tag = run.data.tags.get("ragen.process", "")
        if has_ended(tag):
            client.set_tag(run.info.run_id, "ragen.ended", (
                f"its process ({tag}: host/pid/start) ended without recording the run's end, killed outright "
                f"(signal 9: most often the kernel's out-of-memory killer); closed as KILLED by a later run"))
            client.set_terminated(run.info.run_id, status="KILLED")
            closed.append(run.info.run_id)
    return closed


class MlflowTracker:
    """One MLflow run for one stage, tagged so that ablations and pipeline runs can be found and compared."""

    def __init__(self, cfg: TrackingConfig, *, stage: str, params: dict[str, Any] | None = None,
                 tags: dict[str, str] | None = None, root: Path | None = None, pipeline_run: str = "",
                 config: dict[str, Any] | None = None) -> None:
        self.root = (root or Path.cwd()).resolve()
        self.uri = resolve_tracking_uri(cfg, self.root)
        self.experiment = cfg.experiment
        self.parent_run_id = cfg.parent_run_id
        self.stage = stage
        self.params = params or {}
        self.tags = tags or {}
        self.pipeline_run = pipeline_run
        self.config = config  # the resolved config, logged as the artifact config.yaml
        self.run_id: str | None = None
        self.pipeline_run_id: str | None = None  # the MLflow id of the parent pipeline run
        self.client: MlflowClient | None = None

    @classmethod
    def for_stage(cls, config: Config, stage: str, tags: dict[str, str] | None = None,
                  root: Path | None = None) -> MlflowTracker:
        """A stage run: the flattened resolved config as params, the standard tags, nested in its pipeline run."""
        root = (root or Path.cwd()).resolve()
        return cls(config.tracking, stage=stage, params=flatten(to_dict(config)), root=root,
                   tags=run_tags(config) | (tags or {}), pipeline_run=pipeline_run_id(config, root),
                   config=to_dict(config))

    def __enter__(self) -> MlflowTracker:
        self.client, experiment_id = open_store(self.uri, self.experiment)
        tags = {"ragen.stage": self.stage, "ragen.git_commit": git_commit(self.root), **self.tags}
        tags.update({tag: os.environ[var] for var, tag in PASSTHROUGH_ENV_TAGS.items() if os.environ.get(var)})
        if "torch" in sys.modules:  # the CPU kernels it computed with: AVX2 and AVX-512 ones train other weights;
            tags["ragen.cpu_kernels"] = in_effect()  # and so do 4 threads against 2 (`model.threads`)
            tags["ragen.cpu_threads"] = str(sys.modules["torch"].get_num_threads())
        if self.pipeline_run:
            tags["ragen.pipeline_run"] = self.pipeline_run
            self.pipeline_run_id = self._pipeline_parent(experiment_id, tags)
            tags["mlflow.parentRunId"] = self.pipeline_run_id
        elif self.parent_run_id:
            tags["mlflow.parentRunId"] = self.parent_run_id
        close_ended_runs(self.client, experiment_id)
        tags["ragen.process"] = process_tag()
        run = self.client.create_run(experiment_id, tags=tags,
                                     run_name=f"{self.stage}-{time.strftime('%Y%m%d-%H%M%S')}")
        self.run_id = run.info.run_id
        self._log_params(self.run_id)
        if self.config is not None:
            self.client.log_dict(self.run_id, self.config, "config.yaml")
        return self

    def _log_params(self, run_id: str) -> None:
        params = [Param(key, str(value)[:MAX_PARAM_CHARS]) for key, value in self.params.items()]
        for start in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(run_id, params=params[start : start + 100])

    def _pipeline_parent(self, experiment_id: str, stage_tags: dict[str, str]) -> str:
        """The pipeline run's parent run: found by its tag, or created with the stage's params and tags."""
        found = self.client.search_runs(
            [experiment_id], max_results=1,
            filter_string=f"tags.`ragen.pipeline_run` = '{self.pipeline_run}' and tags.`ragen.stage` = 'pipeline'")
        if found:
            return found[0].info.run_id
        tags = ({k: v for k, v in stage_tags.items() if k not in ("ragen.stage", "dvc.stage")}
                | {"ragen.stage": "pipeline"})
        if self.parent_run_id:
            tags["mlflow.parentRunId"] = self.parent_run_id
        name = stage_tags.get("ragen.variant") or self.pipeline_run
        run = self.client.create_run(experiment_id, tags=tags, run_name=f"pipeline-{name}")
        self._log_params(run.info.run_id)
        self.client.set_terminated(run.info.run_id, status="FINISHED")
        return run.info.run_id

    def __exit__(self, exc_type, exc, tb) -> None:
        """FINISHED; FAILED on an error (an Exception); KILLED when an interruption ended the stage: Ctrl-C, a
        termination signal (SystemExit, Prefect's TerminationSignal), any BaseException that is not an error."""
        if self.client is not None and self.run_id is not None:
            status = ("FINISHED" if exc_type is None else "FAILED" if issubclass(exc_type, Exception) else "KILLED")
            self.client.set_terminated(self.run_id, status=status)

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

    def log_table(self, columns: dict[str, list], name: str) -> None:
        """A table artifact (MLflow's json table format, shown as a table in the UI's artifact view)."""
        import pandas as pd

        self.client.log_table(self.run_id, data=pd.DataFrame(columns), artifact_file=name)

    def log_file(self, path: str | Path, folder: str | None = None) -> None:
        """A file already written (a PNG plot, a report) as an artifact."""
        self.client.log_artifact(self.run_id, str(path), artifact_path=folder)

    def log_to_pipeline(self, metrics: dict[str, float], step: int = 0) -> None:
        """Headline metrics also on the parent pipeline run, so pipeline runs compare in one table."""
        if self.pipeline_run_id:
            now = int(time.time() * 1000)
            self.client.log_batch(self.pipeline_run_id,
                                  metrics=[Metric(k, float(v), now, step) for k, v in metrics.items()])


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

    def log_table(self, columns: dict[str, list], name: str) -> None:
        return None

    def log_file(self, path: str | Path, folder: str | None = None) -> None:
        return None

    def log_to_pipeline(self, metrics: dict[str, float], step: int = 0) -> None:
        return None


__all__ = ["MlflowTracker", "NullTracker", "TrackingError", "open_store", "pipeline_run_id", "preset_of",
           "resolve_tracking_uri", "run_tags"]
