"""Update throughput: one StarPO update with the rows' common prompt prefix run once, against every row run whole.

    python bench/bench_update.py [--envs sokoban frozen_lake bandit] [--repeats 3] [key=value ...]

Needs `dvc repro base` (models/base, data/envs). Per env it plays one training step's rollouts with the base
policy (`train.groups` x `train.group_size`, the starpo_s preset and the overrides), filters and batches them as
stage update does, and times `ragen.update.update` on that batch (critic and actor, every mini-batch) from the same
starting weights, with `share_prefix` on (the default) and off; the median of `--repeats` runs each. Prints the
batch's real tokens, the shared prefix, seconds and trained tokens per second for both, the speed-up, and the
largest difference between the two runs' metrics (they compute the same quantities; only float rounding and a
token on a clip boundary may differ).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from dataclasses import replace

import torch

from flows.common import read_train_pool
from ragen.config import load_config
from ragen.policy import load_policy
from ragen.policy.model import build_critic
from ragen.policy.scoring import shareable_prefix
from ragen.train import collect, return_batch, select, update_settings
from ragen.update import update


def timed_update(policy_model, critic, batch, settings, cfg) -> tuple[float, dict[str, float]]:
    """One update from copies of the given models (so every run starts from the same weights)."""
    model, value_model = copy.deepcopy(policy_model), copy.deepcopy(critic)
    actor_opt = torch.optim.AdamW(model.parameters(), lr=cfg.train.lr, weight_decay=cfg.train.weight_decay)
    critic_opt = torch.optim.AdamW(value_model.parameters(), lr=cfg.critic.lr, weight_decay=cfg.train.weight_decay)
    start = time.perf_counter()
    stats = update(model, value_model, actor_opt, critic_opt, batch, settings)
    return time.perf_counter() - start, stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", nargs="+", default=["sokoban", "frozen_lake", "bandit"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--base", default="models/base")
    parser.add_argument("overrides", nargs="*", help="extra key=value overrides (train.groups=32, ...)")
    args = parser.parse_args()
    print("| env | rows | real tokens | shared prefix | whole rows s | shared s | whole tok/s | shared tok/s | "
          "speed-up | largest metric difference |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for env in args.envs:
        cfg = load_config("params.yaml", ["preset=starpo_s", f"train.env={env}", *args.overrides])
        policy = load_policy(args.base, **cfg.model.placement())
        torch.manual_seed(cfg.train.seed)
        critic = build_critic(policy.model)
        trajectories = collect(cfg, policy, read_train_pool("data/envs", env, cfg.train.max_optimal_moves), step=1)
        kept, scores, _ = select(cfg, trajectories)
        batch = return_batch(cfg, policy, kept, scores)
        tokens = int(batch.attention_mask.sum())
        prefix = shareable_prefix(batch.input_ids, batch.attention_mask, batch.loss_mask)
        settings = update_settings(cfg)
        times: dict[bool, list[float]] = {True: [], False: []}
        stats: dict[bool, dict[str, float]] = {}
        timed_update(policy.model, critic, batch, settings, cfg)  # warm-up (allocator, kernels)
        for _ in range(args.repeats):
            for share in (False, True):
                seconds, stats[share] = timed_update(policy.model, critic, batch,
                                                     replace(settings, share_prefix=share), cfg)
                times[share].append(seconds)
        whole, shared = statistics.median(times[False]), statistics.median(times[True])
        worst = max(stats[True], key=lambda k: abs(stats[True][k] - stats[False][k]))
        print(f"| {env} | {batch.input_ids.shape[0]} | {tokens} | {prefix} | {whole:.2f} | {shared:.2f} | "
              f"{tokens / whole:.0f} | {tokens / shared:.0f} | {whole / shared:.2f}x | "
              f"{worst} {stats[True][worst]:.5g} vs {stats[False][worst]:.5g} |")


if __name__ == "__main__":
    main()
