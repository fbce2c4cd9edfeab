"""Imitation benchmark: how much supervision the embedded policy needs to learn an env; prints a table (not a test).

    python bench/bench_imitation.py [--envs sokoban frozen_lake] [--demos 768 4096] [--steps 800] [--reuse]
                                    [key=value ...]

RAGEN compares StarPO-S with supervised fine-tuning on solver trajectories (Appendix C: 74.6% Sokoban, 23%
FrozenLake for Qwen2.5-0.5B). This benchmark runs that SFT side on the tiny policy, one row per env and number of
demonstrations: stage base with `base.mode=sft`, `base.envs=[env]`, `base.steps`, and one demonstration on each of
`N` distinct train instances (`base.episodes_per_env=N`; stage envgen writes `max(--demos)` train instances into
.bench/imitation/envs/, the val and test instances being the pipeline's). The demonstrated instances start at seed
`--train-seed` (default 2,000,000), outside the pipeline's train pool, so `bench_learning.py --base` from a row
does RL on instances that base never imitated. The policy is then played at the eval temperature on the first 128
instances it imitated (`fit`: what it memorised) and on the val and test splits (`evaluate` flow: what it
generalised). Extra `key=value` overrides reach every stage (e.g. `model.hidden_size=384
model.num_layers=6 model.intermediate_size=1056` for a larger model). A row whose fit is far above its val is short
of data; one whose fit is as low as its val is short of steps or capacity.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from bench_learning import instance_tables  # bench/ is on sys.path when this script runs

from flows.base import base as build_base
from flows.common import read_seeds
from flows.evaluate import evaluate
from ragen.config import load_config
from ragen.evaluation import evaluate_policy
from ragen.kernels import pin_threads
from ragen.policy import load_policy
from ragen.policy.model import count_parameters

ROOT = Path(".bench") / "imitation"
FIT_EPISODES = 128
DEMO_SEED = 2_000_000  # first demonstrated seed: past the pipeline's train (10000+), val (123+) and test (1e6+) seeds


def run_name(env: str, demos: int, steps: int, overrides: list[str]) -> str:
    """Directory name of one row, e.g. sokoban-d768-s800 or sokoban-d768-s800-hidden_size384."""
    extra = [o.split(".")[-1].replace("=", "") for o in overrides]
    return "-".join([env, f"d{demos}", f"s{steps}", *extra])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", nargs="+", default=["sokoban", "frozen_lake"])
    parser.add_argument("--demos", nargs="+", type=int, default=[768, 4096],
                        help="distinct train instances demonstrated, one row each")
    parser.add_argument("--steps", type=int, default=800, help="supervised steps (base.steps)")
    parser.add_argument("--train-seed", type=int, default=DEMO_SEED,
                        help="first seed of the demonstrated instances (envs.train_seed of the bench's envgen)")
    parser.add_argument("--reuse", action="store_true", help="keep rows (and instances) already built")
    parser.add_argument("overrides", nargs="*", help="extra key=value overrides for every stage")
    args = parser.parse_args()
    envs_dir = ROOT / "envs"
    instance_tables(envs_dir, ROOT / "envgen.json", args.envs, train_size=max(args.demos), train_seed=args.train_seed,
                    reuse=args.reuse, overrides=args.overrides)
    rows = []
    for env in args.envs:
        for demos in args.demos:
            out = ROOT / run_name(env, demos, args.steps, args.overrides)
            overrides = ["base.mode=sft", f"base.envs=[{env}]", f"base.steps={args.steps}",
                         f"base.episodes_per_env={demos}", f"train.env={env}", *args.overrides]
            wall_file = out / "wall.json"  # the build's wall time and the first demonstrated seed
            built_row = json.loads(wall_file.read_text()) if wall_file.exists() else {}
            if not (args.reuse and built_row.get("train_seed") == args.train_seed):
                start = time.perf_counter()
                build_base(overrides=overrides, envs_dir=str(envs_dir), out_dir=str(out / "policy"),
                           metrics_path=str(out / "base.json"))
                built_row = {"wall_s": time.perf_counter() - start, "train_seed": args.train_seed}
                wall_file.write_text(json.dumps(built_row))
            cfg = load_config("params.yaml", overrides)
            pin_threads(cfg.model.threads)  # the fit below runs here, after no stage when --reuse
            policy = load_policy(str(out / "policy"), device="cpu")
            fit_seeds = read_seeds(envs_dir, env, "train")[:FIT_EPISODES]
            fit, _ = evaluate_policy(policy, env, fit_seeds, cfg.rollout, temperature=cfg.eval.temperature,
                                     seed=cfg.train.seed)
            result = evaluate(overrides=[*overrides, "eval.against_base=false"], envs_dir=str(envs_dir),
                              policy_dir=str(out / "policy"), metrics_path=str(out / "eval.json"),
                              trajectories_out=str(out / "eval.parquet"))
            rows.append((env, demos, count_parameters(policy.model), built_row["wall_s"], fit["success_rate"],
                         result[env]["val"], result[env]["test"]))
    print(f"\n# imitation benchmark | {args.steps} supervised steps | success at T {cfg.eval.temperature} "
          f"± standard error | {' '.join(args.overrides) or 'default model'}")
    print(f"{'env':<12} {'demos':>6} {'params':>7} {'base s':>7} {'fit':>6} {'val':>12} {'test':>12} {'ceiling':>7}")
    for env, demos, params, wall, fit, val, test in rows:
        cells = [f"{s['success_rate']:>5.3f}±{s['success_se']:.3f}" for s in (val, test)]
        print(f"{env:<12} {demos:>6} {params / 1e6:>6.2f}M {wall:>7.0f} {fit:>6.3f} {cells[0]:>12} {cells[1]:>12} "
              f"{val['success_ceiling']:>7.3f}")


if __name__ == "__main__":
    from entry import run_main

    run_main(main, __file__)
