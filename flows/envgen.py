"""Stage envgen: instance tables for every env in params `envs`, with the solver's ceiling per instance.

Writes data/envs/<tag>/<split>.parquet (train pool, fixed val, held-out test) and metrics/envgen.json, and logs
counts and mean ceilings to one MLflow run.  Run: `python -m flows.envgen [key=value ...]`.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from flows.common import run_stage, staged_dir, write_json
from ragen.config import load_config
from ragen.instances import generate_instances, split_seeds, summarize_instances
from ragen.tracking import MlflowTracker


@task(cache_policy=NO_CACHE)
def write_instance_table(tag: str, split: str, seeds: list[int], out: Path) -> dict[str, float]:
    """Generate and solve one table, write it as parquet, return its summary."""
    table = generate_instances(tag, split, seeds)
    out.parent.mkdir(parents=True, exist_ok=True)
    table.write_parquet(out)
    return summarize_instances(table)


@flow(name="envgen")
def envgen(params: str = "params.yaml", overrides: list[str] | None = None,
           out_dir: str = "data/envs", metrics_path: str = "metrics/envgen.json") -> dict[str, dict]:
    cfg = load_config(params, overrides or [])
    seeds = split_seeds(**{k: v for k, v in asdict(cfg.envs).items() if k != "tags"})
    summary: dict[str, dict] = {}
    timing: dict[str, float] = {}
    with MlflowTracker.for_stage(cfg, "envgen", tags={"ragen.env_tags": ",".join(cfg.envs.tags)}) as tracker:
        with staged_dir(out_dir) as staging:
            for tag in cfg.envs.tags:
                start = time.perf_counter()
                for split, split_seed_list in seeds.items():
                    summary.setdefault(tag, {})[split] = write_instance_table(
                        tag, split, split_seed_list, staging / tag / f"{split}.parquet")
                timing[f"timing/envgen/{tag}_s"] = time.perf_counter() - start
                print(f"envgen | {tag:<13} | {timing[f'timing/envgen/{tag}_s']:5.1f}s | success ceiling "
                      + " ".join(f"{split} {summary[tag][split]['success_ceiling_mean']:.3f}" for split in seeds))
            write_json(staging / "summary.json", summary)
        tracker.log_metrics({f"envgen/{tag}/{split}/{name}": value
                             for tag, splits in summary.items() for split, stats in splits.items()
                             for name, value in stats.items()} | timing)
        write_json(metrics_path, summary)  # deterministic: no timings, so `dvc metrics diff` shows real changes
    return summary


if __name__ == "__main__":
    run_stage(envgen)
