"""Overfit check: can an update fit a handful of fixed instances? RL variants against supervised learning on the
solver's plays of the same instances, from the same base weights.

    python bench/bench_overfit.py [--env sokoban] [--instances 8] [--max-moves 4] [--rollouts 8] [--steps 60]
                                  [--base models/base] [--critic-warmup] [key=value ...]
                                  [--variants sft starpo_s grpo ...]

Needs `dvc repro base` (data/envs, models/base). The learner's sanity check before asking it to generalise: the
first `--instances` train-pool instances whose solver plan takes at most `--max-moves` moves, the same ones every
step, `--rollouts` rollouts each (train.groups = instances, train.group_size = rollouts). A step of an RL variant is
`ragen.train.train_step` on that pool: roll out at temperature 1, filter, score, update. The `sft` variants instead
take one supervised step on demonstrations of those instances (the warm start's token-mean NLL over the response
tokens) and then play the same rollouts, for the record only: `sft` on the solver's plays (`base.mode=sft`'s
demonstrations), held fixed; `sft_fresh` on the same plays with the wording of their thoughts drawn afresh each step
(the sequences change from step to step, as sampled ones do, while the actions stay the solver's); `sft_own` on the
base's own best success of each instance among its rollouts of the first 3 steps, held fixed. Every variant starts
from its own copy of the base (a critic, where the variant uses one, starts as the base with a zero value head and
learns in the loop; with `--critic-warmup` it is first warmed as stage critic_fit warms it, on the filtered step-1
rollouts) and plays step k's rollouts from the same random stream, so step 1 is the base on the same episodes for
all of them.

The key=value overrides apply to every variant, after the common settings (train.lr 1e-3, mini-batches of 32,
format penalty -1: the knobs of bench/RESULTS.md's GRPO runs) and the variant's own (the sft variants read
train.lr, train.weight_decay, train.grad_clip and rollout.*). Prints per variant: the rollout
success over the first and the last 5 steps, per instance over the last 5 (in pool order, with each instance's
optimal moves in the header), the first action's top share and its information on the instance over the last 5 steps
(`ragen.diagnostics.action_dependence`: a policy that reads the puzzle opens differently on different instances),
the actor's entropy, the critic's explained variance over the last 5 steps next to that of GRPO's baseline, the group
mean, on the same batches (`critic/explained_var_group_mean`; variants with a critic) and the seconds per step.
"""

from __future__ import annotations

import argparse
import copy
import math
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

import torch
from transformers import PreTrainedModel

from flows.common import read_instances
from ragen.advantages import group_mean_values
from ragen.batching import build_batch
from ragen.config import Config, load_config
from ragen.diagnostics import action_dependence
from ragen.filters import best_success_per_group
from ragen.kernels import pin_threads
from ragen.losses import explained_variance
from ragen.policy import Policy, load_policy
from ragen.policy.model import build_critic
from ragen.policy.scoring import token_logprobs, token_values
from ragen.records import EpisodeSpec, Trajectory
from ragen.rollout import run_episodes
from ragen.train import Learner, critic_batch, select, train_step
from ragen.update import uses_critic
from ragen.warmstart import scripted_responder, scripted_settings
import ragen.train as train_module

COMMON = ["train.lr=0.001", "train.mini_batch_size=32", "rollout.format_penalty=-1"]
OWN_STEPS = 3  # sft_own: the base's rollouts of this many steps, from which each instance's best success is kept
VARIANTS: dict[str, list[str]] = {
    "sft": [],  # supervised steps (not RL) on the solver's plays, fixed
    "sft_fresh": [],  # on the solver's plays with their thoughts' wording drawn afresh each step
    "sft_own": [],  # on the base's own best success of each instance, fixed
    "starpo_s": ["preset=starpo_s"],
    "grpo": ["algo.advantage=grpo", "filter.keep_ratio=1.0"],
    "grpo_seq_mean": ["algo.advantage=grpo", "filter.keep_ratio=1.0", "algo.aggregation=seq-mean-token-mean"],
    "dr_grpo_seq_mean": ["algo.advantage=grpo", "algo.grpo_by_std=false", "filter.keep_ratio=1.0",
                         "algo.aggregation=seq-mean-token-mean"],
    "rft": ["preset=rft"],
}


@dataclass
class Curve:
    """One variant's record: per step, its rollouts' success per instance, first-action diagnostics, metrics."""

    per_instance: list[list[float]] = field(default_factory=list)  # (steps, instances)
    diagnostics: list[dict[str, float]] = field(default_factory=list)
    metrics: list[dict[str, float]] = field(default_factory=list)
    seconds: float = 0.0


@contextmanager
def recording_rollouts(sink: list[list[Trajectory]]):
    """Keep every batch `train_step` rolls out (it calls `ragen.train.collect`), to read per-instance success."""
    original = train_module.collect

    def collect(*args, **kwargs):
        trajectories = original(*args, **kwargs)
        sink.append(trajectories)
        return trajectories

    train_module.collect = collect
    try:
        yield
    finally:
        train_module.collect = original


def success_per_instance(trajectories: list[Trajectory], pool: list[int]) -> list[float]:
    wins = {seed: [] for seed in pool}
    for t in trajectories:
        wins[t.seed].append(float(t.success))
    return [sum(w) / max(len(w), 1) for w in wins.values()]


def variant_config(name: str, env: str, instances: int, rollouts: int, overrides: list[str]) -> Config:
    if name not in VARIANTS:
        raise SystemExit(f"unknown variant {name!r}; known: {', '.join(VARIANTS)} (key=value overrides go before "
                         "--variants)")
    return load_config("params.yaml", [f"train.env={env}", f"train.groups={instances}",
                                       f"train.group_size={rollouts}", *COMMON, *VARIANTS[name], *overrides])


def solver_plays(cfg: Config, policy: Policy, pool: list[int]) -> list[Trajectory]:
    """One play of the solver per instance, through the rollout's own code path (stage base's sft demonstrations)."""
    r = scripted_settings(cfg.rollout)
    responder = scripted_responder("sft", policy.tokenizer, policy.renderer(r.enable_think).prefix,
                                   max_actions_per_turn=r.max_actions_per_turn, max_turns=r.max_turns,
                                   enable_think=r.enable_think, seed=cfg.base.seed)
    return run_episodes([EpisodeSpec(cfg.train.env, seed, g) for g, seed in enumerate(pool)], responder,
                        policy.renderer(r.enable_think), r, max_positions=policy.max_positions)


def own_best_successes(cfg: Config, policy: Policy, pool: list[int]) -> list[Trajectory]:
    """Each instance's best success (`best_success_per_group`: highest return, then fewest actions) among the
    policy's rollouts of the first OWN_STEPS steps (the same episodes the RL variants play first); instances
    without a success have none."""
    played = [t for step in range(OWN_STEPS) for t in train_module.collect(cfg, policy, pool, step)]
    keep = best_success_per_group(torch.tensor([t.traj_return for t in played]),
                                  torch.tensor([pool.index(t.seed) for t in played]),
                                  torch.tensor([t.success for t in played]),
                                  torch.tensor([t.num_actions for t in played]))
    return [t for t, k in zip(played, keep.tolist()) if k]


def run_sft(cfg: Config, base: Policy, pool: list[int], steps: int, source: str = "sft") -> Curve:
    """Per step: play the pool's rollouts (recorded), then one supervised step on the demonstrations of `source`:
    the solver's plays (`sft`), the same with the thoughts' wording drawn afresh each step (`sft_fresh`: the
    sequences change from step to step as sampled ones do, the actions do not), or the base's own best successes
    (`sft_own`).

        L = - sum_{b,t} m[b,t] log pi(x[b,t] | x[b,<t]) / sum_{b,t} m[b,t]   (m: the response tokens)
    """
    policy = Policy(copy.deepcopy(base.model), base.tokenizer)
    demos = own_best_successes(cfg, policy, pool) if source == "sft_own" else solver_plays(cfg, policy, pool)
    if not demos:
        raise SystemExit("sft_own: the base solved none of the instances in its first rollouts; raise --rollouts")
    batch = build_batch(demos, pad_id=policy.tokenizer.pad_token_id, device=policy.model.device)
    optimizer = torch.optim.AdamW(policy.model.parameters(), lr=cfg.train.lr, weight_decay=cfg.train.weight_decay)
    curve, start = Curve(), time.perf_counter()
    for step in range(steps):
        if source == "sft_fresh" and step > 0:
            demos = solver_plays(replace(cfg, base=replace(cfg.base, seed=cfg.base.seed + step)), policy, pool)
            batch = build_batch(demos, pad_id=policy.tokenizer.pad_token_id, device=policy.model.device)
        trajectories = train_module.collect(cfg, policy, pool, step)
        curve.per_instance.append(success_per_instance(trajectories, pool))
        curve.diagnostics.append(action_dependence(trajectories))
        policy.model.train()
        logprobs, _ = token_logprobs(policy.model, batch.input_ids, batch.attention_mask)  # (B, T)
        loss = -(logprobs * batch.loss_mask).sum() / batch.loss_mask.sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.model.parameters(), cfg.train.grad_clip)
        optimizer.step()
        policy.model.eval()
        curve.metrics.append({"sft/loss": loss.item(), "sft/demos": float(len(demos))})
    curve.seconds = time.perf_counter() - start
    return curve


def warm_critic(cfg: Config, policy: Policy, critic: PreTrainedModel, pool: list[int]) -> dict[str, float]:
    """Stage critic_fit on the overfit pool: `critic.warmup_epochs` passes over the base's step-1 rollouts as the
    filter keeps them (the same episodes step 1 then plays), with an optimizer of its own. Returns the critic's
    explained variance on those rollouts (`fitted`) and on the base's step-2 rollouts (`next`), each beside that of
    GRPO's baseline, the group mean (`*_group_mean`): does the warm-up learn values that carry to other episodes?"""
    batches = [critic_batch(cfg, policy, *select(cfg, train_module.collect(cfg, policy, pool, step))[:2])
               for step in (0, 1)]  # (batch, its targets (B, T))
    train_module.warm_critic(cfg, critic, *batches[0])
    out = {}
    for name, (batch, targets) in zip(("fitted", "next"), batches):
        with torch.no_grad():
            values = token_values(critic, batch.input_ids, batch.attention_mask)  # (B, T)
        out[name] = explained_variance(values, targets, batch.loss_mask)
        out[f"{name}_group_mean"] = explained_variance(group_mean_values(targets, batch.group_ids, batch.loss_mask),
                                                       targets, batch.loss_mask)
    return out


def run_rl(cfg: Config, base: Policy, pool: list[int], steps: int, critic_warmup: bool = False) -> Curve:
    policy = Policy(copy.deepcopy(base.model), base.tokenizer)
    critic = build_critic(policy.model).eval() if uses_critic(cfg.algo.advantage) else None
    if critic is not None and critic_warmup:
        ev = warm_critic(cfg, policy, critic, pool)
        print(f"# critic warmed up: {cfg.critic.warmup_epochs} passes at lr {cfg.critic.lr:g}, explained variance "
              f"{ev['fitted']:+.3f} on the rollouts it fitted (group mean {ev['fitted_group_mean']:+.3f}), "
              f"{ev['next']:+.3f} on the base's next ones (group mean {ev['next_group_mean']:+.3f})", flush=True)
    learner = Learner(policy, critic, None,
                      torch.optim.AdamW(policy.model.parameters(), lr=cfg.train.lr, weight_decay=cfg.train.weight_decay),
                      torch.optim.AdamW(critic.parameters(), lr=cfg.critic.lr, weight_decay=cfg.train.weight_decay)
                      if critic is not None else None)
    if cfg.algo.kl != "none":
        learner.ref = copy.deepcopy(base.model).eval()
    curve, played, start = Curve(), [], time.perf_counter()
    with recording_rollouts(played):
        for step in range(steps):
            curve.metrics.append(train_step(cfg, learner, pool, step))
            curve.per_instance.append(success_per_instance(played[-1], pool))
            curve.diagnostics.append(action_dependence(played[-1]))
    curve.seconds = time.perf_counter() - start
    return curve


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def summary_row(name: str, curve: Curve, window: int = 5) -> str:
    steps = len(curve.per_instance)
    first, last = curve.per_instance[:window], curve.per_instance[-window:]
    per_instance = [mean([row[i] for row in last]) for i in range(len(last[0]))]
    top = mean([d.get("first_action_top_share", float("nan")) for d in curve.diagnostics[-window:]])
    info = mean([d.get("first_action_mi", float("nan")) for d in curve.diagnostics[-window:]])
    entropy = mean([m["actor/entropy"] for m in curve.metrics[-window:] if "actor/entropy" in m])
    explained, by_group = ([m[key] for m in curve.metrics[-window:] if not math.isnan(m.get(key, math.nan))]
                           for key in ("critic/explained_var", "critic/explained_var_group_mean"))
    critic = f"{mean(explained):+.2f} / {mean(by_group):+.2f}" if explained else "-"
    return (f"| {name} | {mean([mean(r) for r in first]):.3f} | {mean([mean(r) for r in last]):.3f} | "
            f"{' '.join(f'{s:.2f}' for s in per_instance)} | {top:.2f} | {info:+.3f} | {entropy:.3f} | "
            f"{critic} | {curve.seconds / steps:.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="sokoban")
    parser.add_argument("--instances", type=int, default=8)
    parser.add_argument("--max-moves", type=int, default=4)
    parser.add_argument("--rollouts", type=int, default=8)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--base", default="models/base")
    parser.add_argument("--envs-dir", default="data/envs")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS))
    parser.add_argument("--critic-warmup", action="store_true",
                        help="warm each critic up first, as stage critic_fit does (critic.warmup_epochs passes)")
    parser.add_argument("overrides", nargs="*", help="key=value overrides for every variant")
    args = parser.parse_args()
    # every variant's config first, so a misspelt name or key stops the run before any training
    configs = {name: variant_config(name, args.env, args.instances, args.rollouts, args.overrides)
               for name in args.variants}
    pin_threads(next(iter(configs.values())).model.threads)  # as the stages compute, on any number of cores
    table = read_instances(args.envs_dir, args.env, "train", ["seed", "optimal_moves"])
    chosen = [(seed, moves) for seed, moves in zip(table["seed"], table["optimal_moves"])
              if moves is not None and moves <= args.max_moves][: args.instances]
    if len(chosen) < args.instances:
        raise SystemExit(f"only {len(chosen)} {args.env} train instances take at most {args.max_moves} moves; "
                         "raise --max-moves or lower --instances")
    pool = [seed for seed, _ in chosen]
    base = load_policy(args.base, **load_config("params.yaml").model.placement())
    print(f"# overfit benchmark | {args.env} | {args.instances} fixed train instances (optimal moves "
          f"{' '.join(str(m) for _, m in chosen)}) x {args.rollouts} rollouts a step | {args.steps} steps | "
          f"base {args.base} | common {' '.join(COMMON + args.overrides)}")
    print("| variant | success, steps 1-5 | last 5 | per instance, last 5 | first action top share | "
          "its information on the instance (nats) | entropy | explained variance: critic / group mean | s/step |")
    print("|---|---|---|---|---|---|---|---|---|")
    curves = {}
    for name, cfg in configs.items():
        torch.manual_seed(cfg.train.seed)
        curves[name] = (run_sft(cfg, base, pool, args.steps, name) if name.startswith("sft")
                        else run_rl(cfg, base, pool, args.steps, args.critic_warmup))
        print(summary_row(name, curves[name]), flush=True)
    print("\nsuccess by step:")
    for name, curve in curves.items():
        print(f"{name:>18} {' '.join(f'{mean(r):.2f}' for r in curve.per_instance)}")


if __name__ == "__main__":
    from entry import run_main

    run_main(main, __file__)
