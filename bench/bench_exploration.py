"""Exploration benchmark: where a policy finds successes at all, by instance difficulty; prints a table (not a test).

    python bench/bench_exploration.py [--env sokoban] [--policy models/base] [--instances 128] [--rollouts 16]

RL only learns from groups that contain a success (StarPO-S keeps the groups with the largest return std). This
plays `--rollouts` episodes of each of the first `--instances` val instances at the rollout temperature, as one
training group does, and prints per solver optimal move count: instances, success rate, and pass@N, the share
of instances where at least one of N rollouts succeeded (N = 4, 8, 16 up to --rollouts), i.e. how often a group
of that size carries any learning signal. Needs `dvc repro envgen base` first.
"""

from __future__ import annotations

import argparse
from collections import defaultdict

from flows.common import read_instances
from ragen.config import load_config
from ragen.evaluation import evaluate_policy
from ragen.kernels import pin_threads
from ragen.policy import load_policy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="sokoban")
    parser.add_argument("--policy", default="models/base")
    parser.add_argument("--instances", type=int, default=128)
    parser.add_argument("--rollouts", type=int, default=16)
    parser.add_argument("overrides", nargs="*", help="key=value overrides (rollout.*)")
    args = parser.parse_args()
    cfg = load_config("params.yaml", args.overrides)
    pin_threads(cfg.model.threads)  # as the stages compute: the same figures on any number of cores
    table = read_instances("data/envs", args.env, "val", ["seed", "optimal_moves"]).head(args.instances)
    moves = dict(zip(table["seed"].to_list(), table["optimal_moves"].to_list()))
    policy = load_policy(args.policy, **cfg.model.placement())
    seeds = [seed for seed in moves for _ in range(args.rollouts)]
    _, trajectories = evaluate_policy(policy, args.env, seeds, cfg.rollout, temperature=cfg.rollout.temperature,
                                      seed=cfg.train.seed)
    wins: dict[int, list[bool]] = defaultdict(list)
    for t in trajectories:
        wins[t.seed].append(t.success)
    sizes = [n for n in (4, 8, 16, 32, 64) if n <= args.rollouts]
    print(f"\n# exploration | {args.env} | {args.policy} | T {cfg.rollout.temperature} | {args.instances} val "
          f"instances x {args.rollouts} rollouts")
    print(f"{'optimal moves':>13} {'instances':>9} {'success':>8} " + " ".join(f"{'pass@' + str(n):>8}" for n in sizes))
    by_moves: dict[int | None, list[int]] = defaultdict(list)  # None: envgen's solver found no solution
    for seed, m in moves.items():
        by_moves[m].append(seed)
    for m in sorted(by_moves, key=lambda m: (m is None, m or 0)):
        seeds = by_moves[m]
        rate = sum(sum(wins[s]) for s in seeds) / (len(seeds) * args.rollouts)
        passes = [sum(any(wins[s][:n]) for s in seeds) / len(seeds) for n in sizes]
        label = "no solution" if m is None else str(m)
        print(f"{label:>13} {len(seeds):>9} {rate:>8.3f} " + " ".join(f"{p:>8.3f}" for p in passes))


if __name__ == "__main__":
    from entry import run_main

    run_main(main, __file__)
