"""Stage rollout: P groups x N rollouts of the base policy on the train env -> data/rollouts/base.parquet.

Run: `python -m flows.rollout [key=value ...]`.
"""

from __future__ import annotations

from prefect import flow

from flows.common import read_train_pool, run_stage, write_json
from flows.lineage import made_with
from ragen.config import load_config
from ragen.kernels import pin_threads
from ragen.policy import load_policy
from ragen.tracking import MlflowTracker
from ragen.train import collect, rollout_metrics
from ragen.trajectory_io import sample_table, write_trajectories


@flow(name="rollout")
def rollout(params: str = "params.yaml", overrides: list[str] | None = None, envs_dir: str = "data/envs",
            base_dir: str = "models/base", out: str = "data/rollouts/base.parquet",
            metrics_path: str = "metrics/rollout.json") -> dict[str, float]:
    cfg = load_config(params, overrides or [])
    pin_threads(cfg.model.threads)  # before any torch work: the same sums on every machine
    pool = read_train_pool(envs_dir, cfg.train.env, cfg.train.max_optimal_moves)
    with MlflowTracker.for_stage(cfg, "rollout") as tracker:
        policy = load_policy(base_dir, **cfg.model.placement())
        trajectories = collect(cfg, policy, pool, step=0)
        metrics = rollout_metrics(trajectories)
        write_trajectories(out, trajectories, settings=made_with("rollout", cfg))
        tracker.log_metrics(metrics)
        tracker.log_table(sample_table(trajectories), "samples/base_rollouts.json")
        write_json(metrics_path, metrics)
        print(f"rollout | {cfg.train.env} | {len(trajectories)} trajectories | success "
              f"{metrics['rollout/success_rate']:.3f} | return {metrics['rollout/return_mean']:.3f}")
    return metrics


if __name__ == "__main__":
    run_stage(rollout)
