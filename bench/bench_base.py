"""The base policy's format-valid and success rates per env at the rollout temperature (not a test).

    python bench/bench_base.py [--episodes 256] [--model models/base] [key=value ...]

Needs `dvc repro base`. Plays the first `--episodes` val instances of every env in params (more than the base
stage's own `base.eval_episodes`, for a tighter figure), with the rollout settings of params.yaml (temperature 1.0
by default), and prints format-valid rate, success rate and the success of random valid actions on the same
instances.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from flows.base import evaluate_base
from ragen.config import load_config
from ragen.kernels import pin_threads
from ragen.policy import load_policy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=256)
    parser.add_argument("--model", default="models/base")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    cfg = load_config("params.yaml", [f"base.eval_episodes={args.episodes}", *args.overrides])
    pin_threads(cfg.model.threads)  # as the stages compute: the same figures on any number of cores
    policy = load_policy(args.model, **cfg.model.placement())
    results, _ = evaluate_base.fn(cfg, policy, Path("data/envs"))
    print(f"\n# base policy {args.model} | {args.episodes} val episodes per env | temperature {cfg.rollout.temperature}")
    print(f"{'env':<14} {'format-valid':>12} {'success':>8} {'random':>8}")
    for tag, r in results.items():
        print(f"{tag:<14} {r['format_valid_rate']:>12.3f} {r['success_rate']:>8.3f} {r['random_success_rate']:>8.3f}")


if __name__ == "__main__":
    from entry import run_main

    run_main(main, __file__)
