"""Nightly benchmarks: the matrix of bench/nightly.yaml on a small budget, checked against recorded baselines.

Each matrix entry is one RL pipeline run (flows.ablate.rl_pipeline) on the shared base policy into
nightly/<stamp>/<entry>/; its figures (val and test success, seconds per step, sampled tokens per second) are
logged to one MLflow run (ragen.stage = nightly) that the entries' pipeline runs nest under. A figure outside its
baseline's bounds fails the flow loudly: the message names the metric, the baseline and the value, the MLflow run
is tagged ragen.regression, and `ragen nightly run` exits non-zero.

Schedule: `ragen nightly serve` serves this flow as the Prefect deployment `nightly/nightly` with the spec's cron
(needs a running Prefect server: `prefect server start`, see README).
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from prefect import flow

from flows.ablate import rl_pipeline
from ragen.baselines import NightlySpec, NightlySpecError, Regression, check_baselines, read_nightly_spec
from ragen.config import load_config
from ragen.policy.model import pick_device
from ragen.tracking import MlflowTracker

DEPLOYMENT = "nightly"


class RegressionError(RuntimeError):
    """A nightly figure fell outside its baseline's bounds."""


def entry_metrics(name: str, summary: dict) -> dict[str, float]:
    """An entry's figures; `val_gap` (stage evaluate's trained-minus-base val success, paired) when eval.against_base
    was on. The speed figures are means over the steps after the first, which trains on stage filter's batch and
    rolls nothing out: an entry of one step has none (a baseline on them then reads missing)."""
    env, train, val = summary["env"], summary["train"], summary["eval"][summary["env"]]["val"]
    phases = [train.get(f"timing/{p}_s_mean") for p in ("rollout", "score", "update")]
    return {f"{name}/val_success": train[f"val/{env}/success"],
            f"{name}/test_success": summary["eval"][env]["test"]["success_rate"],
            **({f"{name}/val_gap": val["success_gap"]} if "success_gap" in val else {}),
            **({f"{name}/seconds_per_step": sum(phases)} if None not in phases else {}),
            **({f"{name}/rollout_tokens_per_s": train["perf/rollout_tokens_per_s_mean"]}
               if "perf/rollout_tokens_per_s_mean" in train else {})}


def check_matrix(spec: str, params: str, extra: list[str] | None = None) -> NightlySpec:
    """The nightly spec, its schedule (`check_cron`) and every entry's knobs (with `extra`) checked against the
    schema before any work, and each entry's `model.device` on this machine (`pick_device`: cuda where torch sees no
    GPU ends it before it trains a missing base or runs an entry)."""
    nightly_spec = read_nightly_spec(spec)
    check_cron(nightly_spec.schedule, f"{spec}: schedule")
    for overrides in nightly_spec.matrix.values():
        pick_device(load_config(params, [*overrides, *(extra or [])]).model.device)
    return nightly_spec


def check_cron(cron: str, where: str) -> str:
    """`cron` when Prefect's cron schedule takes it; a NightlySpecError naming `where` it came from otherwise
    (before, `ragen nightly serve --cron "61 * * *"` ended in pydantic's traceback)."""
    from prefect.client.schemas.schedules import CronSchedule
    from pydantic import ValidationError

    try:
        CronSchedule(cron=cron)
    except ValidationError as error:
        reason = "; ".join(str(e.get("msg", e)).removeprefix("Value error, ") for e in error.errors())
        said = "" if reason.startswith("Invalid cron string") else f" ({reason})"
        raise NightlySpecError(f"{where} {cron!r} is not a cron schedule{said}; one has five fields, minute hour "
                               "day-of-month month day-of-week, as \"0 3 * * *\" (03:00 daily)") from None
    return cron


@flow(name="nightly")
def nightly(spec: str = "bench/nightly.yaml", params: str = "params.yaml", out_root: str = "nightly",
            extra: list[str] | None = None) -> dict[str, float]:
    nightly_spec = check_matrix(spec, params, extra)
    if not (Path("data/envs").exists() and Path("models/base").exists()):
        print("nightly | no base policy yet: dvc repro base")
        subprocess.run(["dvc", "repro", "base"], check=True)
    cfg = load_config(params, [])
    stamp = time.strftime("%Y%m%d-%H%M%S")
    metrics: dict[str, float] = {}
    with MlflowTracker(cfg.tracking, stage="nightly", params={"nightly.spec": spec, "nightly.stamp": stamp},
                       tags={"ragen.nightly": stamp}) as tracker:
        for name, overrides in nightly_spec.matrix.items():
            tracking = [f"tracking.parent_run_id={tracker.run_id or ''}", f"tracking.variant={name}",
                        f"tracking.pipeline_run=nightly-{stamp}-{name}"]
            summary = rl_pipeline([*overrides, *(extra or []), *tracking], Path(out_root) / stamp / name,
                                  params=params)
            metrics |= entry_metrics(name, summary)
        tracker.log_metrics(metrics)
        regressions = check_baselines(metrics, nightly_spec.baselines)
        tracker.set_tags({"ragen.regression": "; ".join(r.metric for r in regressions) or "none"})
        for metric in metrics:
            bound = nightly_spec.baselines.get(metric)
            note = f"(baseline {bound.baseline:g})" if bound else ""
            print(f"nightly | {metric:<40} {metrics[metric]:10.4g} {note}")
        if regressions:
            raise RegressionError("\n".join(r.message() for r in regressions))
        print("nightly | no regression")
    return metrics


def serve(spec: str = "bench/nightly.yaml", cron: str | None = None) -> None:
    """Serve the nightly deployment on the spec's cron schedule until interrupted."""
    nightly.serve(name=DEPLOYMENT, cron=schedule_of(spec, cron), parameters={"spec": spec})


def deployment(spec: str = "bench/nightly.yaml", cron: str | None = None):
    """The deployment object `serve` registers (for inspection and tests)."""
    return nightly.to_deployment(name=DEPLOYMENT, cron=schedule_of(spec, cron), parameters={"spec": spec})


def schedule_of(spec: str, cron: str | None) -> str:
    """The deployment's cron: `cron` (`--cron`) or the spec's schedule, checked (`check_cron`)."""
    if cron:
        return check_cron(cron, "--cron")
    return check_cron(read_nightly_spec(spec).schedule, f"{spec}: schedule")


__all__ = ["Regression", "RegressionError", "check_matrix", "deployment", "nightly", "serve"]


if __name__ == "__main__":  # the same as `ragen nightly ...` (before: it imported the module and exited 0, silently)
    import sys

    from flows.cli import main

    sys.exit(main(["nightly", *sys.argv[1:]]))
