"""Overhead of Prefect, MLflow and DVC against the stage work of the default pipeline; no-op `dvc repro` time.

    python bench/bench_overhead.py            # dvc repro -f of the whole pipeline (~15 min on 2 cores), then no-ops
    python bench/bench_overhead.py --noop     # only the no-op `dvc repro` timing

The pipeline runs as `make run` runs it (one local Prefect server and one warm stage server for all stages,
flows/server.py and flows/warm.py). Stage work is (a) the wall time inside each stage's MLflow run (the flow's
body: reading inputs, training, writing outputs) minus that run's own MLflow calls, which are measured by
replaying the run's logging volume (params, config, metrics by step, a table) against a scratch store, plus (b)
importing what the stages compute with, measured in fresh processes: once the libraries (torch, transformers,
polars, matplotlib, ...; the warm stage server imports them once per pipeline), and per stage the `ragen`
modules its flow imports. Everything else of the `dvc repro -f` wall time is overhead of Prefect, MLflow and
DVC: DVC's hashing and lock, the servers, Prefect's and MLflow's imports and flow engine, MLflow's run setup and
logging. Prints a table.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
STAGES = ["envgen", "base", "rollout", "filter", "critic_fit", "update", "evaluate", "report"]


def run(cmd: list[str], quiet: bool = False) -> float:
    """Wall seconds of `cmd` in the project root with the venv on PATH (stdout dropped; stderr too if quiet)."""
    start = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, check=True, env=os.environ | {"PATH": f"{BIN}:{os.environ['PATH']}"},
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL if quiet else None)
    return time.perf_counter() - start


WORK_LIBRARIES = ["torch", "transformers", "transformers.models.qwen2.modeling_qwen2", "tokenizers",
                  "safetensors.torch", "polars", "omegaconf", "yaml", "matplotlib.pyplot"]


def import_seconds(modules: list[str], after: list[str] = (), repeats: int = 3) -> float:
    """Fresh-process seconds to import `modules` on top of `after` (median of `repeats`, less `after` alone)."""
    before = "; ".join(f"import {m}" for m in after) or "pass"
    code = "; ".join([before, *(f"import {m}" for m in modules)])
    base = [run([sys.executable, "-c", before], quiet=True) for _ in range(repeats)]
    full = [run([sys.executable, "-c", code], quiet=True) for _ in range(repeats)]
    return max(statistics.median(full) - statistics.median(base), 0.0)


def stage_modules(stage: str) -> list[str]:
    """The `ragen` modules flows/<stage>.py computes with (not ragen.tracking)."""
    tree = ast.parse((ROOT / "flows" / f"{stage}.py").read_text())
    return sorted({node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module
                   and node.module.startswith("ragen") and node.module != "ragen.tracking"})


def stage_runs(since_ms: int) -> dict[str, object]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{ROOT / 'mlruns' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("ragen").experiment_id
    runs = client.search_runs([experiment], f"attributes.start_time >= {since_ms}", max_results=1000)
    return {r.data.tags["ragen.stage"]: r for r in runs if r.data.tags.get("ragen.stage") in STAGES}


def mlflow_replay_cost(run) -> float:
    """Seconds to re-log one stage run's params, config, metric history and artifacts into a scratch store."""
    from mlflow.tracking import MlflowClient

    from ragen.config import load_config
    from ragen.tracking import MlflowTracker

    source = MlflowClient(tracking_uri=f"sqlite:///{ROOT / 'mlruns' / 'mlflow.db'}")
    history = {key: source.get_metric_history(run.info.run_id, key) for key in run.data.metrics}
    steps: dict[int, dict[str, float]] = {}
    for key, points in history.items():
        for point in points:
            steps.setdefault(point.step, {})[key] = point.value
    with tempfile.TemporaryDirectory() as scratch:
        cfg = load_config(ROOT / "params.yaml", [f"tracking.uri=sqlite:///{scratch}/mlflow.db"])
        MlflowTracker.for_stage(cfg, "warmup", root=ROOT).__enter__()  # schema creation is paid once per store
        start = time.perf_counter()
        with MlflowTracker.for_stage(cfg, run.data.tags["ragen.stage"], root=ROOT) as tracker:
            for step, values in sorted(steps.items()):
                tracker.log_metrics(values, step=step)
            tracker.log_table({"a": list(range(32))}, "samples/replay.json")
        return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--noop", action="store_true", help="only time no-op `dvc repro` calls")
    parser.add_argument("--reuse", action="store_true", help="the table of the last full run (.bench/overhead.json)")
    args = parser.parse_args()
    record = ROOT / ".bench" / "overhead.json"
    if not args.noop:
        if args.reuse:
            since, total = (json.loads(record.read_text())[k] for k in ("since_ms", "total_s"))
        else:
            since = int(time.time() * 1000)
            total = run([str(BIN / "python"), "-m", "flows.server", "--", "dvc", "repro", "-f"])
            record.parent.mkdir(exist_ok=True)
            record.write_text(json.dumps({"since_ms": since, "total_s": total}))
        runs = stage_runs(since)
        missing = [s for s in STAGES if s not in runs]
        if missing:
            raise SystemExit(f"no MLflow run found for stages {missing}")
        print(f"\n# overhead | dvc repro -f of the default pipeline: {total:.1f} s wall on {os.cpu_count()} cores")
        from flows.warm import PRELOAD

        libraries = import_seconds(WORK_LIBRARIES)
        print(f"{'stage':<11} {'in run s':>9} {'mlflow s':>9} {'imports s':>10} {'work s':>8}")
        print(f"{'(libraries)':<11} {'':>9} {'':>9} {libraries:>10.2f} {libraries:>8.1f}")
        work_total, mlflow_total = libraries, 0.0
        for stage in STAGES:
            r = runs[stage]
            inside = (r.info.end_time - r.info.start_time) / 1000
            mlflow_s = mlflow_replay_cost(r)
            imports = import_seconds(stage_modules(stage), after=PRELOAD)
            work = max(inside - mlflow_s, 0.0) + imports
            work_total, mlflow_total = work_total + work, mlflow_total + mlflow_s
            print(f"{stage:<11} {inside:>9.1f} {mlflow_s:>9.2f} {imports:>10.2f} {work:>8.1f}")
        overhead = total - work_total
        print(f"stage work {work_total:.1f} s | overhead {overhead:.1f} s = {overhead / work_total:.1%} of the work "
              f"(MLflow logging {mlflow_total:.1f} s; DVC, processes, imports and Prefect {overhead - mlflow_total:.1f} s)")
    noops = [run([str(BIN / "dvc"), "repro"]) for _ in range(3)]
    print(f"no-op dvc repro: median {statistics.median(noops):.2f} s (runs: {', '.join(f'{t:.2f}' for t in noops)})")


if __name__ == "__main__":
    from entry import run_main

    run_main(main, __file__)
