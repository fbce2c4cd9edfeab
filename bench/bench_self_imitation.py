"""Self-imitation benchmark: fine-tune a base on its own successful episodes; does that carry to unseen instances?

    python bench/bench_self_imitation.py [--env sokoban] [--max-moves 3] [--instances 1536] [--rollouts 4]
                                         [--steps 1000] [--lr 0.003] [--shortest] [--train-size 24576]
                                         [--base models/base] [key=value ...]

An outcome reward tells a policy-gradient step which of its own episodes to make more likely; the most that step
can take from the base's rollouts is what its successes say. This benchmark hands the policy all of it at once, with
far more gradient than a 30-minute StarPO-S run applies: it plays the base (`--base`) at the training temperature
(rollout.temperature) on `--instances` unseen train-pool instances, `--rollouts` each as a training group would,
keeps the successful episodes (`--shortest`: only the shortest one per instance), and fine-tunes a copy on them
with the warm start's supervised loss (`ragen.warmstart.train_supervised`: response tokens, base.batch_tokens a
step, `--steps` steps at `--lr`); rejection-sampling fine-tuning, the filter step of RAFT, ReST and STaR. Then it
plays base and fine-tuned policy at the eval temperature on the val split (eval.episodes; also on its instances of
at most `--max-moves` solver moves) and on eval.episodes held-out pool instances (the last of the pool, never
rolled out), and prints success with standard errors and the paired gap. The pool is bench_learning's
`.bench/envs-train<N>/` (`--train-size`), restricted to instances of at most `--max-moves` moves (0: all).

A clear gain here means the base's own successes hold a skill that carries and a weak RL step leaves it there;
none means a one-bit contrast on the policy's own episodes has little to give this policy within such a budget.
The rollouts are cached in .bench/self_imitation/ (keyed by env, pool and counts).
"""

from __future__ import annotations

import argparse
import copy
import time
from dataclasses import replace
from pathlib import Path

import torch
from bench_learning import played, train_pool_envs  # bench/ is on sys.path when this script runs

from flows.common import read_instances, read_seeds, read_train_pool
from ragen.config import load_config
from ragen.evaluation import mean_and_se
from ragen.filters import best_success_per_group
from ragen.kernels import pin_threads
from ragen.policy import Policy, load_policy
from ragen.records import EpisodeSpec, Trajectory
from ragen.rollout import policy_responder, run_episodes
from ragen.trajectory_io import read_trajectories, write_trajectories
from ragen.warmstart import train_supervised

CHUNK = 256  # episodes sampled in one batch at most (rollout.max_episodes_per_pass)


def own_rollouts(cfg, policy: Policy, env: str, seeds: list[int], rollouts: int, cache: Path) -> list[Trajectory]:
    """`rollouts` episodes per seed at the training temperature, each seed's episodes one group (shared seed)."""
    if cache.exists():
        return read_trajectories(cache)
    specs = [EpisodeSpec(env, seed, group) for group, seed in enumerate(seeds) for _ in range(rollouts)]
    generator = torch.Generator(policy.model.device).manual_seed(cfg.train.seed)
    rollout = replace(cfg.rollout, max_episodes_per_pass=CHUNK)
    trajectories = run_episodes(specs, policy_responder(policy, rollout, generator=generator),
                                policy.renderer(rollout.enable_think), rollout, max_positions=policy.max_positions)
    cache.parent.mkdir(parents=True, exist_ok=True)
    write_trajectories(cache, trajectories)
    return trajectories


def successes(trajectories: list[Trajectory], shortest: bool) -> list[Trajectory]:
    """Every successful episode, or (`shortest`) each instance's best one: the training loop's rft filter,
    `ragen.filters.best_success_per_group` (highest return, then fewest actions; each seed's rollouts are a group)."""
    if not shortest:
        return [t for t in trajectories if t.success]
    keep = best_success_per_group(torch.tensor([t.traj_return for t in trajectories]),
                                  torch.tensor([t.group_id for t in trajectories]),
                                  torch.tensor([t.success for t in trajectories]),
                                  torch.tensor([t.num_actions for t in trajectories]))
    return [t for t, kept in zip(trajectories, keep.tolist()) if kept]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="sokoban")
    parser.add_argument("--max-moves", type=int, default=3)
    parser.add_argument("--instances", type=int, default=1536)
    parser.add_argument("--rollouts", type=int, default=4)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--lr", type=float, default=0.003)
    parser.add_argument("--shortest", action="store_true")
    parser.add_argument("--train-size", type=int, default=24576)
    parser.add_argument("--base", default="models/base")
    parser.add_argument("overrides", nargs="*", help="extra key=value overrides (rollout.*, eval.*, base.*)")
    args = parser.parse_args()
    cfg = load_config("params.yaml", args.overrides)
    pin_threads(cfg.model.threads)  # as the stages compute: the same figures on any number of cores
    envs_dir = train_pool_envs([args.env], args.train_size, reuse=True)
    pool = read_train_pool(envs_dir, args.env, args.max_moves)
    if len(pool) < args.instances + cfg.eval.episodes:
        raise SystemExit(f"the pool has {len(pool)} instances of at most {args.max_moves} moves; --instances "
                         f"{args.instances} and {cfg.eval.episodes} held out need more: raise --train-size")
    policy = load_policy(args.base, device="cpu")
    start = time.perf_counter()
    cache = Path(".bench/self_imitation") / (f"{Path(args.base).name}-{args.env}-pool{args.train_size}-m{args.max_moves}"
                                            f"-i{args.instances}-r{args.rollouts}.parquet")
    trajectories = own_rollouts(cfg, policy, args.env, pool[: args.instances], args.rollouts, cache)
    data = successes(trajectories, args.shortest)
    rollout_s = time.perf_counter() - start
    model = copy.deepcopy(policy.model)
    torch.manual_seed(cfg.base.seed)
    losses = train_supervised(model, data, pad_id=policy.tokenizer.pad_token_id, steps=args.steps,
                              batch_tokens=cfg.base.batch_tokens, lr=args.lr, warmup_steps=cfg.base.warmup_steps,
                              weight_decay=cfg.base.weight_decay, seed=cfg.base.seed)
    tuned = Policy(model.eval(), policy.tokenizer)
    fit_s = time.perf_counter() - start - rollout_s
    won = sum(t.success for t in trajectories)
    print(f"{args.env}: {len(trajectories)} rollouts of the base on {args.instances} pool instances of <= "
          f"{args.max_moves or 'any'} moves at T {cfg.rollout.temperature}: {won} successes ({won / len(trajectories):.3f}) "
          f"on {len({t.seed for t in trajectories if t.success})} instances; fine-tuned on {len(data)} "
          f"({'shortest per instance' if args.shortest else 'all'}), {args.steps} steps at lr {args.lr}: loss "
          f"{losses[0]:.3f} -> {sum(losses[-20:]) / len(losses[-20:]):.3f}; rollouts {rollout_s:.0f} s, fit {fit_s:.0f} s")
    val = read_seeds(envs_dir, args.env, "val")[: cfg.eval.episodes]
    moves = dict(read_instances(envs_dir, args.env, "val", ["seed", "optimal_moves"]).iter_rows())
    results = {"val": (val, [played(cfg, p, args.env, val) for p in (policy, tuned)])}
    if args.max_moves:
        short = [i for i, seed in enumerate(val) if moves[seed] <= args.max_moves]
        results[f"val, <= {args.max_moves} moves"] = (short, [[r[i] for i in short] for r in results["val"][1]])
    held = pool[-cfg.eval.episodes:]
    results["held-out pool"] = (held, [played(cfg, p, args.env, held) for p in (policy, tuned)])
    print(f"\n| split (T {cfg.eval.temperature}) | episodes | base | self-imitation | paired gap |")
    print("|---|---|---|---|---|")
    for name, (seeds, (base, mine)) in results.items():
        (b, se_b), (m, se_m) = mean_and_se(base), mean_and_se(mine)
        mean, se = mean_and_se([y - x for x, y in zip(base, mine)])
        print(f"| {name} | {len(seeds)} | {b:.3f} ± {se_b:.3f} | {m:.3f} ± {se_m:.3f} | "
              f"{mean / max(se, 1e-9):+.1f} SE |")


if __name__ == "__main__":
    from entry import run_main

    run_main(main, __file__)
