"""Learning benchmark: StarPO-S on the embedded CPU policy, per env; prints a table (not a test).

    python bench/bench_learning.py [--envs bandit frozen_lake sokoban] [--steps 40] [--preset starpo_s] [key=value ...]

Needs `dvc repro base` first (data/envs and models/base). For each env it runs the rollout, filter, critic_fit,
update, evaluate and report flows (flows.ablate.rl_pipeline) into .bench/<preset>/<env>/ (the pipeline's own outputs are untouched), then prints the
base policy's and the trained policy's val success, the solver ceiling and the trained success as a fraction of
it, wall time, and seconds per training step split into rollout, scoring and update, with tokens per second.
"""

from __future__ import annotations

import argparse
import csv
import time
from pathlib import Path

from flows.ablate import rl_pipeline


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", nargs="+", default=["bandit", "frozen_lake", "sokoban"])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--preset", default="starpo_s")
    parser.add_argument("overrides", nargs="*", help="extra key=value overrides for every env")
    args = parser.parse_args()
    rows = []
    for env in args.envs:
        out = Path(".bench") / args.preset / env
        overrides = [f"preset={args.preset}", f"train.env={env}", f"train.steps={args.steps}", *args.overrides]
        start = time.perf_counter()
        summary = rl_pipeline(overrides, out, force=True)
        trained, results = summary["train"], summary["eval"]
        wall = time.perf_counter() - start
        steps = list(csv.DictReader(open(out / "train_steps.csv")))
        base_val = float(steps[0]["val_success"])
        val = results[env]["val"]
        rows.append((env, base_val, val["success_rate"], val["success_ceiling"], val["success_of_ceiling"], wall,
                     trained))
    print(f"\n# learning benchmark | preset {args.preset} | {args.steps} steps")
    print(f"{'env':<12} {'base val':>8} {'trained val':>11} {'ceiling':>8} {'of ceiling':>10} {'wall s':>7} {'s/step':>7}")
    for env, base_val, trained_val, ceiling, frac, wall, t in rows:
        per_step = t["timing/rollout_s_mean"] + t["timing/score_s_mean"] + t["timing/update_s_mean"]
        print(f"{env:<12} {base_val:>8.3f} {trained_val:>11.3f} {ceiling:>8.3f} {frac:>10.1%} {wall:>7.0f} {per_step:>7.1f}")
        print(f"{'':<12} per step: rollout {t['timing/rollout_s_mean']:.2f}s ({t['perf/rollout_tokens_per_s_mean']:.0f}"
              f" sampled tok/s), score {t['timing/score_s_mean']:.2f}s, update {t['timing/update_s_mean']:.2f}s "
              f"({t['perf/update_tokens_per_s_mean']:.0f} trained tok/s)")


if __name__ == "__main__":
    main()
