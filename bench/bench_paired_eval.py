"""Paired evaluation: two policies on the same val and test instances, several episodes each; prints the gap.

    python bench/bench_paired_eval.py --base DIR --trained DIR [--env sokoban] [--envs-dir data/envs]
                                      [--samples 32] [--splits val,test,pool] [--pool-from N] [key=value ...]

A T 0.5 evaluation of 256 instances, one episode each (RAGEN's), moves with its random stream alone: the same
warm base scores between 0.08 and 0.13 on Sokoban val from one stream to the next. That noise is in both policies'
figures and hides a gain of a few points. This benchmark plays both policies (`--base`, `--trained`: policy
directories, e.g. models/base and a bench_learning run's policy/) on the first eval.episodes instances of each
split, `--samples` episodes per instance (`eval.samples`), both from the same random stream (train.seed), and prints
per split each policy's success with its standard error over instances, the trained-minus-base gap of the
per-instance success rates with its paired standard error, and the same by the solver's optimal move count.
With many samples the paired standard error is left with the spread of the true per-instance gains only, so a
small real gain shows and a null result bounds how large the gain can be. Rollout settings (e.g.
`rollout.enable_think=false` for a NoThinking policy) come from params.yaml and the overrides.

`--splits` picks what is played; `pool` is eval.episodes instances of the train pool (of at most
`train.max_optimal_moves` moves, as training reads it) from index `--pool-from` on: pass the run's steps x
train.groups to play instances of the trained difficulties that the run never played (bench_learning.py's
`unseen` row), e.g. at another `eval.temperature` or with more samples than the benchmark used.
"""

from __future__ import annotations

import argparse
import time

from bench_learning import by_moves_line, paired_gap, played_pair, success_by_moves  # bench/ is on sys.path

from flows.common import read_seeds, read_train_pool
from ragen.config import load_config
from ragen.evaluation import mean_and_se
from ragen.kernels import pin_threads
from ragen.policy import load_policy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="policy directory of the reference (e.g. models/base)")
    parser.add_argument("--trained", required=True, help="policy directory compared against it")
    parser.add_argument("--env", default="sokoban")
    parser.add_argument("--envs-dir", default="data/envs", help="stage envgen's instance tables (val and test)")
    parser.add_argument("--samples", type=int, default=32, help="episodes per instance (eval.samples)")
    parser.add_argument("--splits", type=lambda text: text.split(","), default=["val", "test"],
                        help="comma-separated: val, test, pool (train-pool instances from --pool-from on)")
    parser.add_argument("--pool-from", type=int, default=0,
                        help="first train-pool index of split pool (a run's steps x train.groups: its unseen ones)")
    parser.add_argument("overrides", nargs="*",
                        help="extra key=value overrides (rollout.*, eval.*, train.seed, train.max_optimal_moves)")
    args = parser.parse_args()
    if unknown := sorted(set(args.splits) - {"val", "test", "pool"}):
        parser.error(f"--splits {','.join(unknown)}: unknown; choose from val, test, pool")
    cfg = load_config("params.yaml", [f"train.env={args.env}", *args.overrides, f"eval.samples={args.samples}"])
    pin_threads(cfg.model.threads)  # as the stages compute: the same figures on any number of cores
    instances = {}  # split -> seeds, all read before anything is played, so a bad --pool-from fails at once
    for split in args.splits:
        if split == "pool":
            pool = read_train_pool(args.envs_dir, args.env, cfg.train.max_optimal_moves)
            instances[split] = pool[args.pool_from: args.pool_from + cfg.eval.episodes]
            if not instances[split]:
                parser.error(f"--pool-from {args.pool_from}: the {args.env} train pool has only {len(pool)} "
                             f"instances of at most train.max_optimal_moves={cfg.train.max_optimal_moves} moves")
        else:
            instances[split] = read_seeds(args.envs_dir, args.env, split)[: cfg.eval.episodes]
    base_policy, trained_policy = (load_policy(path, device="cpu") for path in (args.base, args.trained))
    rows, start = [], time.perf_counter()
    for split, seeds in instances.items():
        paired = played_pair(cfg, base_policy, trained_policy, args.env, seeds)
        rows.append((split, len(seeds), *(mean_and_se(paired[name].to_list()) for name in ("base", "trained")),
                     paired_gap(paired),
                     success_by_moves(args.envs_dir, args.env, "train" if split == "pool" else split, paired)))
    print(f"\n# paired evaluation | {args.env} | {args.samples} episodes per instance at T {cfg.eval.temperature} | "
          f"base {args.base} | trained {args.trained} | {time.perf_counter() - start:.0f} s"
          + (f" | pool: train pool[{args.pool_from}:] of at most {cfg.train.max_optimal_moves or 'any'} moves"
             if "pool" in args.splits else ""))
    print(f"{'split':<5} {'instances':>9} {'base':>13} {'trained':>13} {'gap':>15} {'gap/se':>6}")
    for split, n, (base, se_b), (trained, se_t), (gap, se), _ in rows:
        print(f"{split:<5} {n:>9} {base:>6.3f}±{se_b:.3f} {trained:>6.3f}±{se_t:.3f} {gap:>+7.4f}±{se:.4f} "
              f"{gap / max(se, 1e-9):>+6.1f}")
    for split, *_, buckets in rows:
        if len(buckets) > 1:
            print(f"{split:<5} by optimal moves (instances: base -> trained): {by_moves_line(buckets)}")


if __name__ == "__main__":
    from entry import run_main

    run_main(main, __file__)
