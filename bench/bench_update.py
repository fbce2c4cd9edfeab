"""Update throughput: one StarPO update with the rows' common prompt prefix run once, against every row run whole,
and with the sampler's log-probs as log pi_old against a re-scoring pass.

    python bench/bench_update.py [--envs sokoban frozen_lake bandit] [--repeats 3] [key=value ...]

Needs `dvc repro base` (models/base, data/envs). Per env it plays one training step's rollouts with the base policy
(`train.groups` x `train.group_size`, the starpo_s preset and the overrides), filters and batches them as stage
update does, and times `ragen.update.update` on that batch (the no-grad scoring pass, then critic, when the
advantage uses one, and actor, every mini-batch) from the same starting weights in three ways: every row whole
(`share_prefix` off), the shared prefix run once (the default), and that with `old_logprobs=sampler` (no re-scoring
of log pi_old; skipped under `algo.loss_mask=all`); the median of `--repeats` runs each. Prints the batch's real
tokens, the shared prefix, seconds and trained tokens per second of each, the speed-ups, and the largest difference
between the runs' metrics (they compute the same quantities; only float rounding and a token on a clip boundary may
differ).
"""

from __future__ import annotations

import argparse
import copy
import math
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
from ragen.update import update, uses_critic


def timed_update(policy_model, critic, batch, settings, cfg) -> tuple[float, dict[str, float]]:
    """One update from copies of the given models (so every run starts from the same weights)."""
    model, value_model = copy.deepcopy(policy_model), copy.deepcopy(critic)
    actor_opt = torch.optim.AdamW(model.parameters(), lr=cfg.train.lr, weight_decay=cfg.train.weight_decay)
    critic_opt = (torch.optim.AdamW(value_model.parameters(), lr=cfg.critic.lr, weight_decay=cfg.train.weight_decay)
                  if value_model is not None else None)
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
    print(f"# update speed on {torch.get_num_threads()} CPU threads (torch's own count; torch {torch.__version__})")
    print("| env | rows | real tokens | shared prefix | whole rows s | shared s | sampler s | whole tok/s | "
          "shared tok/s | sampler tok/s | shared vs whole | sampler vs shared | largest metric difference |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for env in args.envs:
        cfg = load_config("params.yaml", ["preset=starpo_s", f"train.env={env}", *args.overrides])
        policy = load_policy(args.base, **cfg.model.placement())
        torch.manual_seed(cfg.train.seed)
        # grpo and rft read no critic, and stage update then builds none
        critic = build_critic(policy.model) if uses_critic(cfg.algo.advantage) else None
        trajectories = collect(cfg, policy, read_train_pool("data/envs", env, cfg.train.max_optimal_moves), step=1)
        kept, scores, _ = select(cfg, trajectories)
        batch = return_batch(cfg, policy, kept, scores)
        tokens = int(batch.attention_mask.sum())
        prefix = shareable_prefix(batch.input_ids, batch.attention_mask, batch.loss_mask)
        settings = replace(update_settings(cfg), share_prefix=True, old_logprobs="rescore")
        variants = {"whole": replace(settings, share_prefix=False), "shared": settings}
        if cfg.algo.loss_mask == "assistant":  # only sampled tokens have a sampler log-prob
            variants["sampler"] = replace(settings, old_logprobs="sampler")
        times: dict[str, list[float]] = {name: [] for name in variants}
        stats: dict[str, dict[str, float]] = {}
        timed_update(policy.model, critic, batch, settings, cfg)  # warm-up (allocator, kernels)
        for _ in range(args.repeats):
            for name, variant in variants.items():
                seconds, stats[name] = timed_update(policy.model, critic, batch, variant, cfg)
                times[name].append(seconds)
        median = {name: statistics.median(runs) for name, runs in times.items()}
        sampler_s = median.get("sampler", math.nan)
        print(f"| {env} | {batch.input_ids.shape[0]} | {tokens} | {prefix} | {median['whole']:.2f} | "
              f"{median['shared']:.2f} | {sampler_s:.2f} | {tokens / median['whole']:.0f} | "
              f"{tokens / median['shared']:.0f} | {tokens / sampler_s:.0f} | "
              f"{median['whole'] / median['shared']:.2f}x | {median['shared'] / sampler_s:.2f}x | "
              + "; ".join(largest_difference(stats["shared"], stats[name], name)
                          for name in variants if name != "shared") + " |")


def largest_difference(shared: dict[str, float], other: dict[str, float], name: str) -> str:
    """The metric on which a variant's update differs most from the default's (metrics both report)."""
    worst = max(shared.keys() & other.keys(), key=lambda k: abs(shared[k] - other[k]))
    return f"{name}: {worst} {other[worst]:.5g} vs {shared[worst]:.5g}"


if __name__ == "__main__":
    from entry import run_main

    run_main(main, __file__)
