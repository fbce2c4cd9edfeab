"""Look at the MLflow UI in a real browser: headless Chromium screenshots of an ablation set's runs, side by side.

    python bench/mlflow_ui_check.py [--set echo_trap] [--out .bench/mlflow_ui]

Starts `mlflow server` on the local store (mlruns/), opens the experiment `ragen` filtered to the set's update runs
(one pipeline run per variant, carrying the step curves of its update stage) in the chart view and the run list, saves PNG screenshots, stops the
server. Needs a browser: `apt-get install chromium` (or CHROMIUM=/path/to/chrome).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def wait_for(url: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    raise SystemExit(f"{url} did not come up within {timeout_s:.0f} s")


def screenshot(browser: str, url: str, path: Path) -> None:
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    "--window-size=1700,1150", "--virtual-time-budget=90000", "--run-all-compositor-stages-before-draw", f"--screenshot={path}", url],
                   check=True, capture_output=True, timeout=180)
    print(f"screenshot {path} ({path.stat().st_size // 1024} KB)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", default="echo_trap")
    parser.add_argument("--out", default=".bench/mlflow_ui")
    parser.add_argument("--port", type=int, default=5055)
    args = parser.parse_args()
    browser = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        raise SystemExit("no Chromium found: apt-get install chromium, or set CHROMIUM=/path/to/chrome")
    from mlflow.tracking import MlflowClient

    store = f"sqlite:///{ROOT / 'mlruns' / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=store)
    experiment = client.get_experiment_by_name("ragen")
    if experiment is None:
        raise SystemExit("no experiment 'ragen' in mlruns/: run the pipeline first")
    client.set_experiment_tag(experiment.experiment_id, "mlflow.experimentKind", "custom_model_development")
    where = f"tags.`ragen.ablation_set` = '{args.set}' and tags.`ragen.stage` = 'pipeline'"
    runs = client.search_runs([experiment.experiment_id], where)
    if not runs:
        raise SystemExit(f"no pipeline runs of ablation set {args.set!r}: run `ragen ablate {args.set}` first")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = os.environ | {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    server = subprocess.Popen([str(Path(sys.executable).parent / "mlflow"), "server", "--backend-store-uri", store,
                               "--host", "127.0.0.1", "--port", str(args.port), "--workers", "1"],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        base = f"http://127.0.0.1:{args.port}"
        wait_for(f"{base}/health")
        search = urllib.parse.quote(where.replace("`", ""))
        page = f"{base}/#/experiments/{experiment.experiment_id}/runs"
        screenshot(browser, f"{page}?searchFilter={search}&compareRunsMode=CHART", out / f"{args.set}_charts.png")
        screenshot(browser, f"{page}?searchFilter={search}", out / f"{args.set}_runs.png")
        print(f"{len(runs)} pipeline runs of {args.set}: {', '.join(sorted(r.data.tags.get('ragen.variant', '?') for r in runs))}")
    finally:
        server.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    from entry import run_main

    run_main(main, __file__)
