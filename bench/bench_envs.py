"""Environment and solver throughput (prints figures; not a test).

    python bench/bench_envs.py [--n 1000]

Sokoban: rooms generated per second, BFS solves per second, and both together (the envgen cost per instance).
FrozenLake: maps per second and finite-horizon value iterations per second. Countdown: instances per second.
Steps: env.step calls per second on random valid actions.
"""

from __future__ import annotations

import argparse
import platform
import random
import time

from ragen.envs import make_env
from ragen.envs.solvers import countdown_solve, frozen_lake_success_probability, sokoban_min_moves


def rate(n: int, seconds: float) -> str:
    return f"{n / seconds:>10,.0f}/s  ({seconds:6.2f} s for {n})"


def bench_sokoban(tag: str, n: int) -> None:
    env = make_env(tag)
    start = time.perf_counter()
    layouts = [env.reset(seed=seed)[0] for seed in range(n)]
    generated = time.perf_counter() - start
    start = time.perf_counter()
    moves = [sokoban_min_moves(layout) for layout in layouts]
    solved = time.perf_counter() - start
    within = sum(m is not None and m <= env.max_actions_per_traj for m in moves) / n
    print(f"{tag:<14} generate      {rate(n, generated)}")
    print(f"{tag:<14} BFS solve     {rate(n, solved)}")
    print(f"{tag:<14} gen + solve   {rate(n, generated + solved)}   "
          f"mean optimal moves {sum(moves) / n:.2f}, solvable within {env.max_actions_per_traj}: {within:.3f}")


def bench_frozen_lake(n: int) -> None:
    env = make_env("frozen_lake")
    start = time.perf_counter()
    layouts = [env.reset(seed=seed)[0] for seed in range(n)]
    generated = time.perf_counter() - start
    start = time.perf_counter()
    probs = [frozen_lake_success_probability(layout, 10) for layout in layouts]
    solved = time.perf_counter() - start
    print(f"{'frozen_lake':<14} generate      {rate(n, generated)}")
    print(f"{'frozen_lake':<14} VI (10 steps) {rate(n, solved)}   mean success ceiling {sum(probs) / n:.3f}")


def bench_countdown(n: int) -> None:
    env = make_env("countdown")
    start = time.perf_counter()
    for seed in range(n):
        env.reset(seed=seed)
        countdown_solve(env.nums, env.target)
    print(f"{'countdown':<14} gen + solve   {rate(n, time.perf_counter() - start)}")


def bench_steps(n: int) -> None:
    rng = random.Random(0)
    for tag in ("sokoban", "frozen_lake"):
        env = make_env(tag)
        env.reset(seed=0)
        start = time.perf_counter()
        for _ in range(n):
            _, _, terminated, truncated, _ = env.step(rng.choice(env.action_names))
            if terminated or truncated:
                env.reset(seed=rng.randrange(10**6))
        print(f"{tag:<14} env.step      {rate(n, time.perf_counter() - start)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1000, help="instances per measurement")
    args = parser.parse_args()
    print(f"# ragen env benchmark | python {platform.python_version()} | {platform.machine()} | n={args.n}")
    bench_sokoban("sokoban", args.n)
    bench_sokoban("sokoban_large", args.n)
    bench_frozen_lake(args.n)
    bench_countdown(min(args.n, 500))
    bench_steps(20 * args.n)


if __name__ == "__main__":
    from entry import run_main

    run_main(main, __file__)
