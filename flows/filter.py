"""Stage filter: StarPO-S uncertainty filtering of the base rollouts -> data/rollouts/filtered.parquet.

The kept trajectories carry their normalised returns (`score`): with algo.reward_norm_grouping inductive or batch
they are normalised over the whole rollout batch, which critic_fit and update's first step no longer see.

Run: `python -m flows.filter [key=value ...]`.
"""

from __future__ import annotations

from prefect import flow

from flows.common import run_stage, write_json
from flows.lineage import check_input, made_with
from ragen.config import load_config
from ragen.kernels import pin_threads
from ragen.tracking import MlflowTracker
from ragen.train import select
from ragen.trajectory_io import read_settings, read_trajectories, write_trajectories


@flow(name="filter")
def filter_rollouts(params: str = "params.yaml", overrides: list[str] | None = None,
                    rollouts: str = "data/rollouts/base.parquet", out: str = "data/rollouts/filtered.parquet",
                    metrics_path: str = "metrics/filter.json") -> dict[str, float]:
    cfg = load_config(params, overrides or [])
    pin_threads(cfg.model.threads)  # before any torch work: the same sums on every machine
    trajectories, made = read_trajectories(rollouts), read_settings(rollouts)
    check_input(rollouts, made, cfg, "filter", overrides)
    with MlflowTracker.for_stage(cfg, "filter") as tracker:
        kept, scores, metrics = select(cfg, trajectories)
        if not kept:  # filter.within best_success without a success, or filter.mode nonzero / top_p without a spread
            raise ValueError(f"filter: kept none of the {len(trajectories)} base rollouts in {rollouts} "
                             f"({sum(t.success for t in trajectories)} succeeded; filter.within best_success keeps "
                             "successes only, filter.mode nonzero and top_p only groups whose scores differ), so "
                             "update's first step has nothing to train on; roll out more (train.groups, "
                             "train.group_size) or easier instances (train.max_optimal_moves), or use "
                             "filter.within=all, filter.mode=std")
        write_trajectories(out, kept, scores=scores.tolist(),  # normalised before filtering
                           settings=made_with("filter", cfg, made))
        tracker.log_metrics(metrics)
        write_json(metrics_path, metrics)
        print(f"filter | kept {len(kept)}/{len(trajectories)} trajectories | reward-std mass kept "
              f"{metrics['filter/std_mass_kept']:.3f}")
    return metrics


if __name__ == "__main__":
    run_stage(filter_rollouts)
