"""`ragen ablate SET`: every run of an ablation set (ablations.yaml) as a full RL pipeline, then the set's report.

Each run goes rollout -> filter -> critic_fit -> update -> evaluate -> report into ablations/<set>/<run>/ (file
names as in metrics/), on the shared env tables and base policy of `dvc repro base`. Runs are Prefect tasks on the
task runner that ablations.yaml's `runner:` names: a thread pool here, or an existing Dask / Ray cluster by
configuration only. MLflow: one run for the set (ragen.stage = ablation) with the report, and one top-level
pipeline run per variant with its stage runs nested under it, all tagged ragen.ablation_set and ragen.variant, and
ragen.pipeline_run = "<set>-<stamp>-<run>" (the set run carries ragen.ablation_stamp): top-level pipeline runs are
what the MLflow UI's chart view draws side by side. A run whose outputs already match its
config is not run again, so a killed set resumes where it stopped.

Run: `ragen ablate SET [--workers N] [--dry-run] [key=value ...]` or `python -m flows.ablate SET ...`.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import socket
import statistics
import time
from pathlib import Path
from typing import Any, Sequence
from urllib.parse import urlsplit

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from flows.common import (SOURCE_ROOT, check_stop, exclusively, read_seeds, source_digest, stopping_threads,
                          tree_digest, watching, write_json)
from flows.critic_fit import critic_fit
from flows.evaluate import evaluate
from flows.filter import filter_rollouts
from flows.memory import (is_out_of_memory, memory_limits_aside, out_of_memory_message, stage_of,
                          worker_died_message)
from flows.report import report
from flows.rollout import rollout
from flows.server import prefect_api
from flows.update import update_policy
from ragen.ablation import (AblationError, AblationRun, AblationSet, RunnerSpec, expand_set, read_ablations,
                            runner_spec, thread_workers)
from ragen.config import Config, config_digest, load_config, to_dict
from ragen.evaluation import mean_and_se_over_seeds
from ragen.fileio import read_json, write_text
from ragen.policy.model import pick_device
from ragen.report import (echo_trap, gap_text, markdown_table, mean_series, plot_curves, read_steps_csv,
                          template_collapse, to_series)
from ragen.tracking import MlflowTracker
from ragen.trajectory_io import instance_success_rates


def base_episodes_file(cfg: Config, set_dir: Path, base_dir: str) -> Path:
    """Where the runs of a set keep the base policy's evaluation episodes for `cfg`: ablations/<set>/.base_eval/.

    Stage evaluate plays the base on the same instances from the same random stream as the trained policy. Those
    episodes depend on the env tables (`envs`), the policy's placement (`model`), `rollout`, `eval`, `train.env`,
    `train.seed` (the stream's seed), the base policy's files and the code, not on what a variant trains: the file
    is named by a digest of exactly those, so the variants of one seed play the base once, and anything else gets a
    file of its own.
    """
    config = to_dict(cfg)
    inputs = {key: config[key] for key in ("envs", "model", "rollout", "eval")}
    inputs |= {"train.env": cfg.train.env, "train.seed": cfg.train.seed}
    payload = json.dumps([inputs, source_digest(), tree_digest(base_dir)], sort_keys=True)
    return set_dir / ".base_eval" / f"{hashlib.sha256(payload.encode()).hexdigest()[:16]}.parquet"


def run_record_digest(cfg: Config, base_dir: str) -> str:
    """What a finished variant's `done.json` records: the config (tracking and the micro-batch limits aside, which
    change memory only: `memory_limits_aside`), the source code (ragen/ and flows/) and the base policy's files."""
    return config_digest(memory_limits_aside(cfg), source_digest(), tree_digest(base_dir))[:16]


def rl_pipeline(overrides: Sequence[str], out: Path, *, params: str = "params.yaml", envs_dir: str = "data/envs",
                base_dir: str = "models/base", base_metrics: str = "metrics/base.json", force: bool = False
                ) -> dict[str, Any]:
    """rollout -> filter -> critic_fit -> update -> evaluate -> report of one configuration into `out`.

    Returns update's summary (val success, timings), evaluate's results and the wall time (wall_s). Skipped, with
    the results read back, when `out/done.json` records the same run digest (unless `force`; `run_record_digest`).
    The base policy's evaluation episodes are shared with the set's other runs that play the base alike
    (`base_episodes_file`; `force` plays them again).
    """
    overrides = list(overrides)
    cfg = load_config(params, overrides)
    digest = run_record_digest(cfg, base_dir)
    done = out / "done.json"
    record = read_json(done, "run record", "delete it and this run is rerun") if done.exists() and not force else {}
    if record.get("digest") == digest:
        print(f"ablate | {out} is up to date, not rerun")
        return record["results"]
    if record:
        print(f"ablate | {out} was run with other params, code or base policy; running it again")
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    common = dict(params=params, overrides=overrides)
    check_stop()  # here and between the stages: an interrupted set (`stopping_threads`) ends its runs
    rollout(**common, envs_dir=envs_dir, base_dir=base_dir, out=str(out / "base.parquet"),
            metrics_path=str(out / "rollout.json"))
    check_stop()
    filter_rollouts(**common, rollouts=str(out / "base.parquet"), out=str(out / "filtered.parquet"),
                    metrics_path=str(out / "filter.json"))
    check_stop()
    critic_fit(**common, base_dir=base_dir, rollouts=str(out / "filtered.parquet"), out_dir=str(out / "critic_warm"),
               metrics_path=str(out / "critic_fit.json"))
    check_stop()
    trained = update_policy(**common, envs_dir=envs_dir, base_dir=base_dir, critic_dir=str(out / "critic_warm"),
                            rollouts=str(out / "filtered.parquet"), base_rollouts=str(out / "base.parquet"),
                            policy_dir=str(out / "policy"), critic_out=str(out / "critic"),
                            metrics_path=str(out / "train.json"),
                            steps_csv=str(out / "train_steps.csv"), checkpoint_dir=str(out / "checkpoint"))
    check_stop()
    shared = base_episodes_file(cfg, out.parent, base_dir)
    if force:
        shared.unlink(missing_ok=True)
    results = evaluate(**common, envs_dir=envs_dir, policy_dir=str(out / "policy"), base_dir=base_dir,
                       metrics_path=str(out / "eval.json"), trajectories_out=str(out / "eval.parquet"),
                       base_trajectories_out=str(out / "eval_base.parquet"), base_episodes=str(shared))
    if Path(base_metrics).exists():
        shutil.copyfile(base_metrics, out / "base.json")
        report(**common, metrics_dir=str(out), out_dir=str(out / "report"), policy_dir=str(out / "policy"))
    summary = {"env": cfg.train.env, "train": trained, "eval": results, "wall_s": time.perf_counter() - start}
    write_json(done, {"digest": digest, "results": summary})
    return summary


def stop_file(out_root: str, set_name: str, stamp: str) -> Path:
    """Created when the set's run `stamp` is stopped; its variants, on any runner, end at their next step."""
    return Path(out_root) / set_name / ".stopped" / stamp


RERUN_WITH_IT = ("give the set the setting (`ragen ablate SET key=value`) and a rerun skips the variants that "
                 "finished")


@task(cache_policy=NO_CACHE)
def run_variant(run: AblationRun, set_name: str, out_root: str, params: str, stamp: str) -> dict[str, Any]:
    """One variant's pipeline. Running out of memory ends it with an `AblationError` that names the variant, its
    stage and the settings to lower (`flows.memory`), which `ragen ablate` prints as its one line."""
    tracking = [f"tracking.ablation_set={set_name}", f"tracking.variant={run.name}",
                f"tracking.pipeline_run={set_name}-{stamp}-{run.name}"]
    try:
        with watching(stop_file(out_root, set_name, stamp)):
            return rl_pipeline([*run.overrides, *tracking], Path(out_root) / set_name / run.name, params=params)
    except RuntimeError as error:  # torch.OutOfMemoryError is one
        if not is_out_of_memory(error):
            raise
        stage = stage_of(error, SOURCE_ROOT)  # "": not through a stage's flow; update's settings are the likeliest
        message = out_of_memory_message(stage or "update", error, load_config(params, list(run.overrides)),
                                        SOURCE_ROOT)
        raise AblationError(f"variant {run.name}" + (f", stage {stage}" if stage else "") + f": {message}; "
                            f"{RERUN_WITH_IT}") from None


class NoWorkerLeft(AblationError):
    """A variant waited for a Dask worker longer than the scheduler's no-workers-timeout."""


def variant_result(run: AblationRun, future: Any, params: str, address: str = "") -> dict[str, Any]:
    """The variant's summary from its future. On a Dask cluster a variant whose every worker died (the scheduler
    gives up after a few: distributed's KilledWorker) ends the set with an `AblationError` naming it and the
    settings that bound what it holds at once, since a worker killed for memory is the usual cause; and one that
    waited for a worker longer than the scheduler's `distributed.scheduler.no-workers-timeout` (when it has one; by
    default a cluster waits for its workers to come back) ends it with one naming that."""
    try:
        return future.result()
    except Exception as error:
        if type(error).__name__ in ("NoWorkerError", "NoValidWorkerError"):
            raise NoWorkerLeft(f"variant {run.name}: the Dask cluster had no worker to run it for longer than its "
                               f"scheduler's no-workers-timeout (distributed's {type(error).__name__}); start "
                               f"workers in this project folder (`dask worker {address or '<scheduler address>'}`) "
                               f"and rerun; a rerun skips the variants that finished") from None
        if type(error).__name__ != "KilledWorker":
            raise
        raise AblationError(f"variant {run.name}: {worker_died_message(load_config(params, list(run.overrides)))}; "
                            f"{RERUN_WITH_IT}") from None


def set_results(runs: Sequence[AblationRun], futures: Sequence[Any], params: str, address: str = ""
                ) -> dict[str, dict[str, Any]]:
    """Each variant's summary (`variant_result`), in the set's order. A cluster whose workers died running some
    variants (and whose nannies closed: a LocalCluster closes one whose worker is not back within
    `distributed.deploy.lost-worker-timeout`) leaves the rest waiting for a worker until the scheduler's
    no-workers-timeout: that wait is the consequence, the deaths the cause. So when a variant's error is the wait,
    the later variants are collected too (with no worker left, none of them is still running) and the first whose
    workers died ends the set in its place."""
    results = {}
    for index, (run, future) in enumerate(zip(runs, futures)):
        try:
            results[run.name] = variant_result(run, future, params, address)
        except NoWorkerLeft as waited:
            for other, later in zip(runs[index + 1 :], futures[index + 1 :]):
                try:
                    variant_result(other, later, params, address)
                except NoWorkerLeft:
                    continue
                except AblationError as died:
                    raise died from None
            raise waited from None
    return results


def workers_here(spec: RunnerSpec, params: str) -> int:
    """The thread pool's size for `spec` (`thread_workers`) with the device the params' `model.device` resolves to
    on this machine."""
    device = pick_device(load_config(params, []).model.device).type
    return thread_workers(spec.workers, device, os.cpu_count() or 2)


def check_dask_scheduler(address: str, timeout_s: float = 10.0) -> int:
    """The number of workers of the Dask scheduler at `address`; an `AblationError` naming the address when it is
    malformed or names an unknown host, or when no scheduler answers there within `timeout_s` (before, the set's
    flow started and ended 30 s later in distributed's connection traceback)."""
    from distributed import Client
    from distributed.comm import resolve_address

    where = "`--address tcp://host:8786`, or runner.address in ablations.yaml"
    try:
        resolve_address(address)  # before a client, which would retry a host it cannot resolve until its timeout
    except (ValueError, socket.gaierror) as error:
        raise AblationError(f"runner.address {address}: {error}; give a Dask scheduler's address as {where}"
                            ) from None
    try:
        with Client(address, timeout=timeout_s, set_as_default=False) as client:
            return len(client.scheduler_info()["workers"])
    except OSError as error:
        raise AblationError(f"runner.address {address}: no Dask scheduler answered there within {timeout_s:g} s "
                            f"({error}); start one (`dask scheduler`, and `dask worker <its address>` in this project "
                            f"folder) or give its address ({where})") from None


RAY_KEYWORDS = ("auto", "local")  # ray.init's own: the cluster this machine runs, or a new one here


def check_ray_address(address: str, timeout_s: float = 10.0) -> None:
    """An `AblationError` naming `address` when it is neither one of Ray's keywords (`RAY_KEYWORDS`) nor
    `ray://host:port` (a Ray Client server, 10001 by default) or `host:port` (the head's GCS, 6379 by default), when
    its host is unknown, or when nothing accepts a connection there within `timeout_s` (before, nothing looked at
    the address until ray.init, once the set's flow had started). A port that accepts is not proof of a Ray head."""
    if address in RAY_KEYWORDS:
        return
    where = ("`--address ray://host:10001` (Ray Client) or `host:6379` (the head's GCS), or runner.address in "
             "ablations.yaml")
    client = address.startswith("ray://")
    try:
        parts = urlsplit(address if client else f"ray://{address}")
        host, port = parts.hostname, parts.port
    except ValueError as error:
        raise AblationError(f"runner.address {address}: {error}; give a Ray address as {where}") from None
    if not host or port is None or parts.path or parts.query or parts.fragment:
        raise AblationError(f"runner.address {address}: not host:port; give a Ray address as {where}")
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as error:
        raise AblationError(f"runner.address {address}: unknown host {host} ({error.strerror}); give a Ray address "
                            f"as {where}") from None
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as error:
        what = "Ray Client server" if client else "Ray head"
        raise AblationError(f"runner.address {address}: no {what} accepted a connection there within {timeout_s:g} s "
                            f"({error.strerror or error}); start one (`ray start --head`, then `ray start --address "
                            f"<head>:6379` in this project folder on each worker machine) or give its address as "
                            f"{where}") from None


def task_runner(spec: RunnerSpec, params: str = "params.yaml"):
    """Prefect task runner for the spec: threads here (`workers_here` at once), or an existing Dask / Ray cluster
    (a Dask scheduler must answer at its address, `check_dask_scheduler`; something must accept a connection at a
    Ray address, `check_ray_address`)."""
    if spec.kind == "threads":
        from prefect.task_runners import ThreadPoolTaskRunner

        return ThreadPoolTaskRunner(max_workers=workers_here(spec, params))
    try:
        if spec.kind == "dask":
            from prefect_dask import DaskTaskRunner

            if not check_dask_scheduler(spec.address):
                print(f"ablate | the Dask cluster at {spec.address} has no worker yet: the set waits for one (start "
                      f"`dask worker {spec.address}` in this project folder)")
            return DaskTaskRunner(address=spec.address)
        from prefect_ray import RayTaskRunner

        check_ray_address(spec.address)
        return RayTaskRunner(address=spec.address)
    except ImportError:
        raise AblationError(f"runner.kind {spec.kind} needs prefect-{spec.kind}: pip install -e '.[{spec.kind}]'"
                            ) from None


def val_gap(out: Path, runs: Sequence[AblationRun], reference: Sequence[AblationRun], results: dict[str, dict],
            envs_dir: str) -> str:
    """A variant's val success minus the reference variant's, paired by seed and by instance (`paired_val_gap`)."""
    by_seed = {run.seed: run for run in reference}
    env = results[runs[0].name]["env"]
    pairs = []
    for run in runs:
        other = by_seed[run.seed].name
        n = min(results[name]["eval"][env]["val"]["instances"] for name in (run.name, other))
        pairs.append((out / run.name / "eval.parquet", out / other / "eval.parquet", n))
    return paired_val_gap(pairs, env, envs_dir)


def base_val_gap(out: Path, runs: Sequence[AblationRun], results: dict[str, dict], envs_dir: str) -> str:
    """A variant's val success minus the base policy's on the same episodes (each run's eval_base.parquet, written
    by stage evaluate under eval.against_base), paired by seed and by instance (`paired_val_gap`)."""
    env = results[runs[0].name]["env"]
    return paired_val_gap([(out / run.name / "eval.parquet", out / run.name / "eval_base.parquet",
                            results[run.name]["eval"][env]["val"]["instances"]) for run in runs], env, envs_dir)


def paired_val_gap(pairs: Sequence[tuple[Path, Path, int]], env: str, envs_dir: str) -> str:
    """The mean over pairs (one a seed: evaluation files `mine` and `theirs` and the val instances they share) of
    the per-instance val success gaps mine - theirs, with its standard error over seeds that share their instances
    (`mean_and_se_over_seeds`): '+0.012 ± 0.010 (+1.2 SE)', or '+0.000' without a spread."""
    gaps = []
    for mine, theirs, n in pairs:
        seeds = read_seeds(envs_dir, env, "val")[:n]
        a, b = (instance_success_rates(path, env, seeds) for path in (mine, theirs))
        gaps.append([x - y for x, y in zip(a, b)])
    mean, se_inst, se_seed = mean_and_se_over_seeds(gaps)
    se = math.hypot(se_inst, se_seed)
    return gap_text(mean, se) if se > 0 else f"{mean:+.3f}"


def set_report(ablation: AblationSet, out_root: Path, results: dict[str, dict], envs_dir: str = "data/envs"
               ) -> tuple[Path, list[Path]]:
    """ablations/<set>/report.md and curves: one curve per variant (mean over its seeds, min-max band), and each
    variant's val gap to the first one (`val_gap`)."""
    out = out_root / ablation.name
    by_variant: dict[str, list[AblationRun]] = {}
    for run in ablation.runs:
        by_variant.setdefault(run.variant, []).append(run)
    reference = next(iter(by_variant))
    series, rows = [], []
    for variant, runs in by_variant.items():
        per_run = [to_series(run.name, read_steps_csv(out / run.name / "train_steps.csv")) for run in runs]
        series.append(mean_series(variant, per_run))
        env = results[runs[0].name]["env"]
        row: list[object] = [variant, env, len(runs)]
        for split in ("val", "test"):
            values = [results[run.name]["eval"][env][split]["success_rate"] for run in runs]
            row += [statistics.mean(values), statistics.stdev(values) if len(values) > 1 else math.nan]
        try:
            if variant == reference:
                gap = "reference"
            elif env != results[by_variant[reference][0].name]["env"]:
                gap = "other env"  # no instances in common (the paper set's variants on bandit, sokoban, ...)
            else:
                gap = val_gap(out, runs, by_variant[reference], results, envs_dir)
        except (OSError, KeyError, ValueError) as error:  # a run from before eval.parquet, or of other instances
            gap = "n/a"
            print(f"ablate | {ablation.name}: no paired val gap for {variant}: {error}")
        try:
            lift = base_val_gap(out, runs, results, envs_dir)
        except (OSError, KeyError, ValueError) as error:  # eval.against_base off, or a run from before it
            lift = "n/a"
            print(f"ablate | {ablation.name}: no paired val gap to the base for {variant}: {error}")
        row += [gap, lift, results[runs[0].name]["eval"][env]["val"]["success_ceiling"],
                "; ".join(sorted({str(echo_trap(s)["verdict"]) for s in per_run})),
                "; ".join(str(step) if (step := template_collapse(s)["collapse_step"]) is not None else "none"
                          for s in per_run)]
        rows.append(row)
    pngs = plot_curves(series, out / "plots", f"ablation set {ablation.name}")
    transfer = generalisation_table(by_variant, results)
    text = "\n".join([
        f"# Ablation set `{ablation.name}`", "", ablation.description, "",
        markdown_table(["variant", "env", "runs", "val success", "sd", "test success", "sd",
                        f"val minus {reference} (paired)", "val minus base (paired)", "val ceiling",
                        "echo trap marker",
                        "template marker (per seed)"], rows),
        "", f"val minus {reference}: the gap of the per-instance val success rates, paired by seed and instance, "
        "with its standard error over seeds that share their instances (ragen.evaluation.mean_and_se_over_seeds); "
        "val minus base: the same against the base policy played on the same episodes by stage evaluate "
        "(eval.against_base); sd is the spread of the runs' val success.", "",
        *transfer,
        "Curves: the mean over a variant's seeds, the band its min and max; dotted lines mark reward-std "
        "collapse (ragen/report.py); dashed ones in the val panel, the in-loop val on train.val_envs.", "",
        f"![curves](plots/{pngs[0].name})", "",
        "Runs:", "", *[f"- `{run.name}`: {' '.join(run.overrides)}" for run in ablation.runs], ""])
    write_text(out / "report.md", text)
    return out / "report.md", pngs


def generalisation_table(by_variant: dict[str, list[AblationRun]], results: dict[str, dict]) -> list[str]:
    """The report's lines for the paper's table 4: each variant's val success on the envs stage evaluate played
    beside its train.env (its generalisation envs), the mean over its seeds; none when no variant has any."""
    rows, envs = [], []
    for variant, runs in by_variant.items():
        trained = results[runs[0].name]["env"]
        other = {tag: generalisation_cell([results[run.name]["eval"][tag]["val"] for run in runs])
                 for tag in results[runs[0].name]["eval"] if tag != trained}
        envs += [tag for tag in other if tag not in envs]
        rows.append((variant, trained, other))
    if not envs:
        return []
    table = markdown_table(["variant", "trained on", *envs],
                           [(variant, trained, *(other.get(tag, math.nan) for tag in envs))
                            for variant, trained, other in rows])
    return ["Generalisation (the paper's table 4): val success on the envs stage evaluate plays beside the one "
            "trained on, the mean over a variant's seeds, and the base policy's on the same episodes "
            "(eval.against_base; '-': not played for that env).", "", table, ""]


def generalisation_cell(splits: Sequence[dict]) -> str:
    """'0.113 (base 0.109)': the mean val success of a variant's runs on one env, and the base's where every run has
    it."""
    text = f"{statistics.mean(split['success_rate'] for split in splits):.3f}"
    if all("base_success_rate" in split for split in splits):
        text += f" (base {statistics.mean(split['base_success_rate'] for split in splits):.3f})"
    return text


@flow(name="ablate")
def ablate(set_name: str, extra: list[str] | None = None, ablations: str = "ablations.yaml",
           params: str = "params.yaml", out_root: str = "ablations", runner: str | None = None,
           workers: int | None = None, address: str | None = None) -> dict[str, dict]:
    data = read_ablations(ablations)
    ablation = expand_set(data, set_name, params=params, extra=extra or [])  # every knob checked before any work
    spec = runner_spec(data, kind=runner, workers=workers, address=address)
    for needed in ("data/envs", "models/base"):
        if not Path(needed).exists():
            raise FileNotFoundError(f"{needed} is missing: variants share the base pipeline; run `dvc repro base` "
                                    "first")
    cfg = load_config(params, [])
    stamp = time.strftime("%Y%m%d-%H%M%S")
    workers = workers_here(spec, params) if spec.kind == "threads" else spec.workers or "auto"
    print(f"ablate | {set_name}: {len(ablation.runs)} runs on {spec.kind} "
          f"({workers} workers{', ' + spec.address if spec.address else ''})")
    with stopping_threads(stop_file(out_root, set_name, stamp)), MlflowTracker(
            cfg.tracking, stage="ablation", params={"ablation.set": set_name, "ablation.runs": len(ablation.runs),
                                                    "ablation.extra": " ".join(extra or [])},
            tags={"ragen.ablation_set": set_name, "ragen.ablation_stamp": stamp}) as tracker:
        submit = run_variant.with_options(task_run_name=f"{set_name}/{{run.name}}")
        futures = [submit.submit(run, set_name, out_root, params, stamp) for run in ablation.runs]
        results = set_results(ablation.runs, futures, params, spec.address)
        report_path, pngs = set_report(ablation, Path(out_root), results)
        for path in [report_path, *pngs]:
            tracker.log_file(path, "report")
        tracker.log_metrics({f"{name}/val_success": r["eval"][r["env"]]["val"]["success_rate"]
                             for name, r in results.items()})
        print(f"ablate | {set_name} done | report {report_path}")
    return results


def run_ablation(set_name: str, extra: Sequence[str] = (), *, runner: str | None = None, workers: int | None = None,
                 address: str | None = None, ablations: str = "ablations.yaml") -> dict[str, dict]:
    """The flow on the task runner the file (or the arguments) name, holding the set's folder: a second run of the
    set meanwhile (another terminal, other overrides) fails at once instead of writing into the same run folders
    (one run's evaluation could read the other's policy, and its run record then name the wrong one). It reports
    to the configured Prefect API, or else to a local server of its own (`prefect_api`)."""
    data = read_ablations(ablations)
    expand_set(data, set_name, extra=list(extra))  # a wrong set name or knob fails before the set's folder exists
    spec = runner_spec(data, kind=runner, workers=workers, address=address)
    runner_here = task_runner(spec)  # before the flow: a Dask scheduler that does not answer ends it in one line
    with exclusively(Path("ablations") / set_name / ".lock", f"ablations/{set_name}/"), prefect_api():
        return ablate.with_options(task_runner=runner_here)(
            set_name, list(extra), ablations=ablations, runner=runner, workers=workers, address=address)


if __name__ == "__main__":  # the same as `ragen ablate ...`: its options, its one-line errors and Ctrl-C
    import sys

    from flows.cli import main

    sys.exit(main(["ablate", *sys.argv[1:]]))
