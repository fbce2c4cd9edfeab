"""Learning benchmark: StarPO-S on the embedded CPU policy, per env; prints a table (not a test).

    python bench/bench_learning.py [--envs bandit frozen_lake sokoban] [--steps 40] [--preset starpo_s] [--reuse]
                                   [--sft-base-steps N [--sft-base-envs TAG,...] | --base DIR] [--train-size N]
                                   [--seeds S,S,...] [key=value ...]

Needs `dvc repro base` first (data/envs and models/base). For each env it runs the rollout, filter, critic_fit,
update, evaluate and report flows (flows.ablate.rl_pipeline) into .bench/<preset>/<run>/ (the pipeline's own
outputs are untouched); the wall time of that is the training budget the issue's targets count. Then, on the same
val and test episodes at the same temperature (eval.*), it evaluates the base policy (`evaluate` flow on
models/base) and random valid actions, and prints per split: random, base and trained success with their standard
errors, the trained-minus-base gap in standard errors (unpaired, and paired over the same episodes: `paired`), the
solver ceiling and the trained success as a fraction of it, and (envs with instances of several difficulties)
base and trained success on those episodes by the solver's optimal move count (buckets, then 1, 2 and 3 moves
apart). Then base and trained success at the eval temperature on the first eval.episodes instances of the train
pool (`played`: training played them first) and, when the pool is longer than the run plays, on as many right after
the last one played (`unseen`), each with the paired gap and by optimal moves: the same difficulties, so a gain on
`played` that `unseen` lacks is memorisation, and one on both is a skill however little of val it covers. Then the
rollout success on the train pool over the first and the last 10 steps (what the policy learned on the instances it
trains on, e.g. a `train.max_optimal_moves` curriculum), and over six equal windows of steps (with --train-size large
enough that no instance comes twice, that curve is the success on unseen instances at the training temperature, on far
more episodes than val has; its level is to be read against the base's success on such instances, which the
`unseen` row gives at the eval temperature), under it the mean optimal moves of each window's instances (a pool in
seed order is not equally hard throughout). Last, seconds per training step split into rollout, scoring and update,
with tokens per second.

`--sft-base-steps N` starts from (and compares against) a base with some skill instead of the pipeline's warm base:
stage base with `base.mode=sft base.steps=N` (solver demonstrations for every env, N supervised steps) built into
.bench/base_sft<N>/, and the runs go to .bench/<preset>-sft<N>/<run>/. RAGEN starts from an instruction-tuned LLM,
which has priors; the warm base has none. `--sft-base-envs sokoban` trains that base on the demonstrations of the
named envs only (`base.envs`; the tokenizer still sees every env), so N steps buy that env more skill; the names
join the directory names (.bench/base_sft<N>-sokoban/, .bench/<preset>-sft<N>-sokoban/<run>/). `--base DIR` starts
from a base built elsewhere (DIR/policy/ and DIR/base.json, e.g. a row of bench/bench_imitation.py); the runs go to
.bench/<preset>-<name of DIR>/<run>/. <run> is the env, the step count and a digest of the extra overrides
(`run_name`, e.g. sokoban-s270-3f9c0a1e), so runs with other knobs keep their own directory; overrides.txt in it
lists them.

`--seeds 0,1,2` trains one run per training seed (`train.seed=S`, which also seeds each run's evaluations of base
and trained policy), prints the figures above for each (run `sokoban/s1`, ...) and then, per env and split, the mean
paired gap over the seeds with its standard error. That is the figure to judge a lift by: a paired standard error
over instances compares one trained policy with the base, and at a large step size runs of the same knobs end on
either side of it. Every seed plays the same instances, so the error holds the spread over instances once (of the
gaps averaged over seeds) and the spread between the seeds' gaps (`ragen.evaluation.mean_and_se_over_seeds`); the
per-seed paired errors are not averaged as if each seed had its own instances. With --reuse, a run already trained
and measured (its bench.json) with the same params, source code and base is read back, so seeds can be added one at a
time (after an edit under ragen/ or flows/ it is trained again); a bench.json from before the
per-instance gaps gets them (val and test from its evaluations' parquet files, the pool rows by playing those
instances again, about a minute a run).

`--train-size N` trains on a pool of N train instances instead of data/envs' 1024 (envs.train_size): stage envgen
writes the named envs with the same seeds into .bench/envs-train<N>/ (same val and test instances, a longer train
pool from the same first seed), and every run, evaluation and pool row reads that directory; the run directories
get `-pool<N>`. With N >= steps x train.groups no train instance is visited twice, so memorising the pool is no
longer a way to raise the rollout success.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
from collections import defaultdict
from pathlib import Path

import polars as pl

from flows.ablate import rl_pipeline
from flows.base import base as build_base
from flows.common import read_instances, read_seeds, read_train_pool, write_json
from flows.envgen import envgen
from flows.evaluate import evaluate
from ragen.config import Config, ConfigError, load_config
from ragen.evaluation import evaluate_policy, instance_success, mean_and_se, mean_and_se_over_seeds
from ragen.kernels import pin_threads
from ragen.policy import Policy, load_policy
from ragen.records import EpisodeSpec
from ragen.report import CURVES, read_steps_csv
from ragen.rollout import run_episodes, summarize
from ragen.train import step_specs
from ragen.trajectory_io import instance_success_rates
from ragen.warmstart import scripted_responder, scripted_settings


WINDOWS = 6  # the train-pool rollout success curve is printed as this many window means
OPENING = {key: CURVES[key] for key in ("rollout/first_action_entropy", "rollout/first_action_mi")} | {
    "rollout/first_action_top_share": "most common first action's share"}  # ragen.diagnostics, by csv column


def paired_episodes(envs_dir: str, out: Path, env: str, split: str, episodes: int, samples: int) -> pl.DataFrame:
    """Base and trained success on the same val or test instances (eval_base.parquet, eval.parquet): one row per seed
    with `seed`, `base`, `trained`, in the split's order; each is the instance's success rate over its `samples`
    episodes (`instance_success_rates`), and both evaluations must have played exactly that many."""
    seeds = read_seeds(envs_dir, env, split)[:episodes]
    try:
        base, trained = (instance_success_rates(out / name, env, seeds, samples=samples)
                         for name in ("eval_base.parquet", "eval.parquet"))
    except ValueError as err:
        raise ValueError(f"{err} (or rerun without --reuse)") from None
    return pl.DataFrame({"seed": seeds, "base": base, "trained": trained})


def instance_gaps(both: pl.DataFrame) -> dict[str, list]:
    """The instances of `paired_episodes` or `played_pair` and each one's trained-minus-base gap, for a row of
    bench.json: `seed_summary` pools them over training seeds."""
    return {"instances": both["seed"].to_list(), "instance_gaps": (both["trained"] - both["base"]).to_list()}


def paired_gap(both: pl.DataFrame) -> tuple[float, float]:
    """Trained-minus-base success over `paired_episodes` and its paired standard error (`mean_and_se`)."""
    return mean_and_se((both["trained"] - both["base"]).to_list())


MOVE_BUCKETS = ((1, 3), (4, 6), (7, 10), (11, None))  # the solver's optimal moves; > 10 is past the action budget


def bucket_label(lo: int, hi: int | None) -> str:
    return f"{lo}-{hi}" if hi is not None else f">{lo - 1}"


def success_by_moves(envs_dir: str, env: str, split: str, paired: pl.DataFrame) -> list[tuple[str, int, float, float]]:
    """Base and trained success over `paired_episodes` by the solver's optimal move count (envgen's `optimal_moves`):
    (bucket, episodes, base, trained) for each non-empty bucket of MOVE_BUCKETS, where the learning is (or is not);
    then, when the instances need different move counts, the first bucket again per exact count (`=1`, `=2`, ...):
    an outcome says most about the first action of a one-move puzzle (bench_signal.py --exact), so a skill learned
    there can show in that row and vanish in its bucket."""
    moves = read_instances(envs_dir, env, split, ["seed", "optimal_moves"])
    both = paired.join(moves, on="seed", how="left")
    parts = []
    for lo, hi in MOVE_BUCKETS:
        upper = pl.lit(True) if hi is None else pl.col("optimal_moves") <= hi
        parts.append((bucket_label(lo, hi), both.filter((pl.col("optimal_moves") >= lo) & upper)))
    if both["optimal_moves"].drop_nulls().n_unique() > 1:  # None: unsolvable, no move count
        lo, hi = MOVE_BUCKETS[0]
        parts += [(f"={m}", both.filter(pl.col("optimal_moves") == m)) for m in range(lo, hi + 1)]
    return [(name, part.height, part["base"].mean(), part["trained"].mean()) for name, part in parts if part.height]


def by_moves_line(by_moves: list[tuple[str, int, float, float]]) -> str:
    """`success_by_moves`' rows as one printed line: `bucket (instances): base -> trained | ...`."""
    return " | ".join(f"{name} ({n}): {base:.3f} -> {trained:.3f}" for name, n, base, trained in by_moves)


def moves_per_step(cfg: Config, envs_dir: str, env: str, steps: int) -> list[float]:
    """Mean optimal move count of the instances each step 0..steps-1 rolls out (`step_specs` over the train pool),
    so a window of the rollout-success curve can be read against its instance mix (a pool in seed order is not
    equally hard throughout)."""
    pool = read_train_pool(envs_dir, env, cfg.train.max_optimal_moves)
    table = read_instances(envs_dir, env, "train", ["seed", "optimal_moves"])
    moves = dict(zip(table["seed"].to_list(), table["optimal_moves"].to_list()))
    per_step = []
    for step in range(steps):
        known = [moves[spec.seed] for spec in step_specs(cfg, pool, step)[:: cfg.train.group_size]
                 if moves[spec.seed] is not None]
        per_step.append(sum(known) / len(known) if known else math.nan)
    return per_step


def random_success(cfg: Config, policy: Policy, envs_dir: str, env: str, split: str) -> float:
    """Success of random valid actions (the warm-start script) on the episodes `evaluate` plays."""
    renderer = policy.renderer(cfg.rollout.enable_think)
    seeds = read_seeds(envs_dir, env, split)[: cfg.eval.episodes]
    respond = scripted_responder("warm", renderer.tokenizer, renderer.prefix, seed=cfg.train.seed,
                                 max_actions_per_turn=cfg.rollout.max_actions_per_turn,
                                 max_turns=cfg.rollout.max_turns, enable_think=cfg.rollout.enable_think)
    specs = [EpisodeSpec(env, s, i) for i, s in enumerate(seeds)]
    trajectories = run_episodes(specs, respond, renderer, scripted_settings(cfg.rollout),
                                max_positions=policy.max_positions)
    return summarize(trajectories)["success_rate"]


def run_name(env: str, steps: int, overrides: list[str], train_size: int = 0) -> str:
    """Directory of one env's run: `<env>-s<steps>`, `-pool<N>` with --train-size N, plus a digest of the extra
    overrides when there are any (e.g. sokoban-s270-3f9c0a1e), so runs with other knobs do not overwrite each other;
    `overrides.txt` in it lists them."""
    name = f"{env}-s{steps}" + (f"-pool{train_size}" if train_size else "")
    if not overrides:
        return name
    return f"{name}-{hashlib.sha1(' '.join(overrides).encode()).hexdigest()[:8]}"


def instance_tables(envs_dir: Path, metrics: Path, envs: list[str], *, train_size: int, train_seed: int,
                    reuse: bool, overrides: list[str]) -> None:
    """Stage envgen into `envs_dir` (its metrics in `metrics`) with a train pool of `train_size` seeds from
    `train_seed` (val and test as params.yaml has them). Kept with `reuse` when it already holds at least that many
    train instances from that first seed for every env in `envs`. Also used by bench_imitation.py."""
    built = json.loads(metrics.read_text()) if metrics.exists() else {}
    if not (reuse and all(built.get(env, {}).get("train", {}).get("count", 0) >= train_size
                          and read_seeds(envs_dir, env, "train")[0] == train_seed for env in envs)):
        envgen(overrides=[f"envs.train_size={train_size}", f"envs.train_seed={train_seed}", *overrides],
               out_dir=str(envs_dir), metrics_path=str(metrics))


def train_pool_envs(envs: list[str], train_size: int, reuse: bool) -> str:
    """.bench/envs-train<N>/: the instance tables of `envs` with a train pool of `train_size` seeds from the
    pipeline's first train seed (`instance_tables`; val and test as in data/envs)."""
    envs_dir = Path(".bench") / f"envs-train{train_size}"
    instance_tables(envs_dir, envs_dir.parent / f"envs-train{train_size}.json", envs, train_size=train_size,
                    train_seed=load_config("params.yaml").envs.train_seed, reuse=reuse,
                    overrides=[f"envs.tags=[{','.join(envs)}]"])
    return str(envs_dir)


def played(cfg: Config, policy: Policy, env: str, seeds: list[int]) -> list[float]:
    """Success rate of each seed over eval.samples episodes at the eval temperature (0/1 with one), in the seeds'
    order."""
    _, trajectories = evaluate_policy(policy, env, seeds, cfg.rollout, temperature=cfg.eval.temperature,
                                      seed=cfg.train.seed, samples=cfg.eval.samples)
    return instance_success(trajectories, len(seeds))


def played_pair(cfg: Config, base_policy: Policy, trained_policy: Policy, env: str, seeds: list[int]
                ) -> pl.DataFrame:
    """Both policies on the same instances (`played`, same random stream): one row per seed with `seed`, `base`,
    `trained`, each the instance's success rate over eval.samples episodes, as `paired_gap` and `success_by_moves`
    read them."""
    return pl.DataFrame({"seed": seeds, "base": played(cfg, base_policy, env, seeds),
                         "trained": played(cfg, trained_policy, env, seeds)})


def pool_windows(cfg: Config, pool_size: int, steps: int) -> dict[str, tuple[int, int]]:
    """The train-pool instances (index ranges into the pool) whose base and trained success the pool rows compare:
    `played`, the first eval.episodes (fewer if the run plays fewer), which step 1 (the stage-filter batch) and the
    steps after it play first; and, when the pool is longer than what the run plays (steps x train.groups, step s
    playing pool[s*P:(s+1)*P]), `unseen`, up to eval.episodes right after the last instance played. Both hold
    instances of the same difficulties, so a gain on `played` that `unseen` does not share is memorisation of the
    instances; one that both share is a skill, whatever val (which holds longer puzzles than a
    `train.max_optimal_moves` pool) shows."""
    n, played_to = cfg.eval.episodes, steps * cfg.train.groups
    windows = {"played": (0, min(n, pool_size, played_to))}
    if played_to < pool_size:
        windows["unseen"] = (played_to, min(played_to + n, pool_size))
    return windows


def pool_fit(cfg: Config, base_policy: Policy, trained_policy: Policy, envs_dir: str, env: str, steps: int
             ) -> dict[str, dict]:
    """Base and trained success at the eval temperature over each of `pool_windows`' instances (eval.samples
    episodes each): per window its index range, the success rates, the paired gap with its standard error and the
    same by the solver's optimal move count, in the shape of a val or test row (`seed_summary` reads it)."""
    pool = read_train_pool(envs_dir, env, cfg.train.max_optimal_moves)
    rows = {}
    for name, (lo, hi) in pool_windows(cfg, len(pool), steps).items():
        paired = played_pair(cfg, base_policy, trained_policy, env, pool[lo:hi])
        gap, paired_se = paired_gap(paired)
        rows[name] = {"window": [lo, hi], "base": {"success_rate": paired["base"].mean()},
                      "trained": {"success_rate": paired["trained"].mean()}, "gap": gap, "paired_se": paired_se,
                      "by_moves": success_by_moves(envs_dir, env, "train", paired), **instance_gaps(paired)}
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", nargs="+", default=["bandit", "frozen_lake", "sokoban"])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--preset", default="starpo_s")
    parser.add_argument("--reuse", action="store_true",
                        help="keep a finished run with the same config (and its wall time) instead of training again")
    parser.add_argument("--sft-base-steps", type=int, default=0,
                        help="start from a base trained N steps on solver demonstrations (0: the warm models/base)")
    parser.add_argument("--sft-base-envs", type=lambda text: text.split(","), default=[],
                        help="with --sft-base-steps: comma-separated envs whose demonstrations that base imitates "
                             "(default: all)")
    parser.add_argument("--base", default="",
                        help="start from a base built elsewhere: a directory holding policy/ and base.json, such as "
                             "a row of bench/bench_imitation.py (.bench/imitation/<row>)")
    parser.add_argument("--train-size", type=int, default=0,
                        help="train on a pool of N train instances (.bench/envs-train<N>/) instead of data/envs'")
    parser.add_argument("--seeds", type=lambda text: [int(seed) for seed in text.split(",")], default=[],
                        help="comma-separated training seeds: one run each (train.seed=S, which also seeds its "
                             "evaluations), then the mean paired gap over them with its standard error between seeds")
    parser.add_argument("overrides", nargs="*", help="extra key=value overrides for every env")
    args = parser.parse_args()
    # checked before any training, for each env (an option such as algo.shaping holds for some envs only)
    try:
        cfg = [load_config("params.yaml", [f"preset={args.preset}", f"train.env={env}", *args.overrides])
               for env in args.envs][0]
    except ConfigError as error:
        parser.error(str(error))
    base_dir, base_metrics, runs = "models/base", "metrics/base.json", Path(".bench") / args.preset
    if args.base and args.sft_base_steps > 0:
        parser.error("--base and --sft-base-steps both choose the base; pass one")
    if args.base:
        base_dir, base_metrics = str(Path(args.base) / "policy"), str(Path(args.base) / "base.json")
        if not Path(base_metrics).exists():
            parser.error(f"--base {args.base}: no base.json there; build it first (bench/bench_imitation.py)")
        runs = Path(".bench") / f"{args.preset}-{Path(args.base).name}"
    elif args.sft_base_steps > 0:
        name = "-".join([f"sft{args.sft_base_steps}", *args.sft_base_envs])
        base_dir, base_metrics = f".bench/base_{name}", f".bench/base_{name}.json"
        runs = Path(".bench") / f"{args.preset}-{name}"
        if not (args.reuse and Path(base_metrics).exists()):
            build_base(overrides=["base.mode=sft", f"base.steps={args.sft_base_steps}",
                                  f"base.envs=[{','.join(args.sft_base_envs)}]"],
                       out_dir=base_dir, metrics_path=base_metrics)
    envs_dir = train_pool_envs(args.envs, args.train_size, args.reuse) if args.train_size > 0 else "data/envs"
    results = [measure(env, seed, args, runs, envs_dir, base_dir, base_metrics)
               for env in args.envs for seed in args.seeds or [None]]
    print(f"\n# learning benchmark | preset {args.preset} | {args.steps} steps | base {base_dir} | "
          f"instances {envs_dir} | success rate ± standard error over instances, {cfg.eval.samples} episode(s) each")
    print(f"{'run':<15} {'split':<5} {'random':>6} {'base':>12} {'trained':>12} {'gap/se':>6} {'paired':>6} "
          f"{'ceiling':>7} {'of ceiling':>10} {'train wall s':>12}")
    for r in results:
        for row in r["splits"]:
            (se_b, se_t), before, trained = row["ses"], row["base"], row["trained"]
            gap = (trained["success_rate"] - before["success_rate"]) / max(math.hypot(se_b, se_t), 1e-9)
            print(f"{r['run']:<15} {row['split']:<5} {row['random']:>6.3f} {before['success_rate']:>6.3f}±{se_b:.3f} "
                  f"{trained['success_rate']:>6.3f}±{se_t:.3f} {gap:>6.1f} {row['paired']:>6.1f} "
                  f"{trained['success_ceiling']:>7.3f} {trained['success_of_ceiling']:>10.1%} {r['wall']:>12.0f}")
    for r in results:
        for row in r["splits"]:
            if len(row["by_moves"]) > 1:  # one bucket (bandit: every instance is one pull) says nothing new
                print(f"{r['run']:<15} {row['split']:<5} by optimal moves (episodes: base -> trained): "
                      + by_moves_line(row["by_moves"]))
    for r in results:
        for name, row in r["pool"].items():
            lo, hi = row["window"]
            print(f"{r['run']:<15} train-pool success at T {cfg.eval.temperature}, {name} (pool[{lo}:{hi}]): base "
                  f"{row['base']['success_rate']:.3f}, trained {row['trained']['success_rate']:.3f}, paired gap "
                  f"{row['gap']:+.3f} ({row['gap'] / max(row['paired_se'], 1e-9):+.1f} SE); by optimal moves: "
                  + by_moves_line(row["by_moves"]))
    for r in results:
        for row in r["splits"]:
            line = first_action_line(row["base"], row["trained"])
            if line:
                print(f"{r['run']:<15} {row['split']:<5} first action, base -> trained: {line}")
    for r in results:
        print_curve(r["run"], r["curve"], r["moves"], r.get("opening", {}))
    for r in results:
        t = defaultdict(lambda: math.nan, r["timing"])  # a run of one step rolls nothing out in process
        per_step = t["timing/rollout_s_mean"] + t["timing/score_s_mean"] + t["timing/update_s_mean"]
        print(f"{r['run']:<15} {per_step:.1f} s per step: rollout {t['timing/rollout_s_mean']:.2f}s "
              f"({t['perf/rollout_tokens_per_s_mean']:.0f} sampled tok/s), score {t['timing/score_s_mean']:.2f}s "
              f"({t['perf/score_tokens_per_s_mean']:.0f} scored tok/s), "
              f"update {t['timing/update_s_mean']:.2f}s ({t['perf/update_tokens_per_s_mean']:.0f} trained tok/s)")
    if len(args.seeds) > 1:
        for env in args.envs:
            for split in ("val", "test"):
                print(seed_summary(env, split, [row for r in results if r["env"] == env
                                                for row in r["splits"] if row["split"] == split]))
            for window in ("played", "unseen"):
                rows = [r["pool"][window] for r in results if r["env"] == env and window in r["pool"]]
                if rows:
                    print(seed_summary(env, f"pool, {window}", rows))


def print_curve(run: str, success: list[float], moves: list[float], opening: dict[str, list[float]]) -> None:
    """The train-pool rollout success of steps 2.. (`success`; step 1 trains on the stage-filter batch, so its
    figures are not a fresh rollout): first and last 10 steps, then WINDOWS equal windows with the mean optimal moves
    of their instances (`moves`, the same steps') and the first-action diagnostics of their rollouts (`opening`:
    csv column -> the same steps' values; NaN in runs made before they were logged)."""
    if not success:  # a one-step run has no fresh rollout to report
        return
    head, tail = success[:10], success[-10:]
    print(f"{run:<15} train-pool rollout success: steps 2-{len(head) + 1} {sum(head) / len(head):.3f}, "
          f"last {len(tail)} {sum(tail) / len(tail):.3f}")
    if len(success) >= 2 * WINDOWS:  # the whole curve, in WINDOWS equal runs of steps
        bounds = [round(i * len(success) / WINDOWS) for i in range(WINDOWS + 1)]
        spans = list(zip(bounds, bounds[1:]))
        print(f"{run:<15} train-pool rollout success in {WINDOWS} windows of steps: "
              + " ".join(f"{lo + 2}-{hi + 1} {sum(success[lo:hi]) / (hi - lo):.3f}" for lo, hi in spans))
        print(f"{run:<15} mean optimal moves of those windows' instances: "
              + " ".join(f"{lo + 2}-{hi + 1} {sum(moves[lo:hi]) / (hi - lo):.2f}" for lo, hi in spans))
        for key, values in opening.items():
            if not any(math.isnan(v) for v in values):
                print(f"{run:<15} {OPENING[key]} in those windows: "
                      + " ".join(f"{lo + 2}-{hi + 1} {sum(values[lo:hi]) / (hi - lo):.3f}" for lo, hi in spans))


def first_action_line(base: dict[str, float], trained: dict[str, float]) -> str:
    """Base -> trained first-action diagnostics of one split's evaluation (ragen.diagnostics; the information needs
    eval.samples >= 2), '' where the evaluations predate them."""
    keys = [k for k in ("first_action_entropy", "first_action_mi", "first_action_top_share")
            if k in base and k in trained]
    return " | ".join(f"{OPENING['rollout/' + k]} {base[k]:.3f} -> {trained[k]:.3f}" for k in keys)


def seed_summary(env: str, split: str, rows: list[dict]) -> str:
    """One line over the runs of several training seeds: mean base and trained success, the mean paired gap with its
    standard error, and how many seeds ended above their base.

    The seeds of one benchmark play the same instances, so the spread of the true per-instance gains is shared by
    all of them and does not average out over seeds. With each row's per-instance gaps (`instance_gaps` over the
    same `instances`) the error is `mean_and_se_over_seeds`': sqrt(se_inst^2 + se_seed^2), the spread over
    instances of the seed-averaged gaps plus the spread between the seeds' mean gaps. Rows from before the
    per-instance gaps fall back to the larger of the spread between seeds and sqrt(sum of per-seed paired SE^2) /
    seeds, which treats the seeds' instances as independent draws and so reads too small where they are shared."""
    n = len(rows)
    gaps = [row["gap"] for row in rows]
    base = sum(row["base"]["success_rate"] for row in rows) / n
    trained = sum(row["trained"]["success_rate"] for row in rows) / n
    head = f"{env:<12} {split:<5} over {n} seeds: base {base:.3f}, trained {trained:.3f}, paired gap "
    tail = f", above base in {sum(g > 0 for g in gaps)} of {n}: " + ", ".join(f"{g:+.3f}" for g in gaps)
    if all("instance_gaps" in row and row["instances"] == rows[0]["instances"] for row in rows):
        mean_gap, se_inst, se_seed = mean_and_se_over_seeds([row["instance_gaps"] for row in rows])
        se = math.hypot(se_inst, se_seed)
        return (head + f"{mean_gap:+.3f} ± {se:.3f} (instances ± {se_inst:.3f}, seeds ± {se_seed:.3f}; "
                f"{mean_gap / max(se, 1e-9):+.1f} SE)" + tail)
    mean_gap, between = mean_and_se(gaps)
    eval_only = math.sqrt(sum(row["paired_se"] ** 2 for row in rows)) / n
    return (head + f"{mean_gap:+.3f} ± {between:.3f} between seeds, ± {eval_only:.3f} from evaluation noise alone "
            f"({mean_gap / max(between, eval_only, 1e-9):+.1f} SE of the larger; instances taken as independent)"
            + tail)


def measure(env: str, seed: int | None, args: argparse.Namespace, runs: Path, envs_dir: str, base_dir: str,
            base_metrics: str) -> dict:
    """Train one run (`rl_pipeline`; with `seed`, `train.seed=<seed>` after the extra overrides) and measure it
    against the base: the figures `main` prints, as a json-able dict, also written to <run>/bench.json. With --reuse,
    a run whose bench.json is newer than its done.json (not trained since) is read back instead of evaluated again."""
    extra = [*args.overrides, *([f"train.seed={seed}"] if seed is not None else [])]
    out = runs / run_name(env, args.steps, extra, args.train_size)
    # eval.against_base off: the base is evaluated once below, on the same episodes, for the paired figures
    overrides = [f"preset={args.preset}", f"train.env={env}", f"train.steps={args.steps}",
                 "eval.against_base=false", *extra]
    out.mkdir(parents=True, exist_ok=True)
    (out / "overrides.txt").write_text("\n".join(overrides) + "\n")  # first: a killed run says what it was
    summary = rl_pipeline(overrides, out, envs_dir=envs_dir, base_dir=base_dir, base_metrics=base_metrics,
                          force=not args.reuse)
    cached, done = out / "bench.json", out / "done.json"
    cfg, base_policy = load_config("params.yaml", overrides), load_policy(base_dir, device="cpu")
    pin_threads(cfg.model.threads)  # where --reuse ran no stage here, the figures below as the stages compute
    if args.reuse and cached.exists() and cached.stat().st_mtime >= done.stat().st_mtime:
        result = json.loads(cached.read_text())
        # measured before the unseen-pool row or the per-instance gaps: add what is missing, keep the rest
        stale_pool = "pool" not in result or any("instance_gaps" not in row for row in result["pool"].values())
        stale_splits = [row for row in result["splits"] if "instance_gaps" not in row]
        if stale_pool:
            result.pop("fit", None)
            pool = pool_fit(cfg, base_policy, load_policy(str(out / "policy"), device="cpu"), envs_dir, env,
                            args.steps)
            moved = [name for name, row in result.get("pool", {}).items()
                     if row["base"]["success_rate"] != pool[name]["base"]["success_rate"]]
            if moved:  # another base (rebuilt on another machine): the stored rows stay, without per-instance gaps
                print(f"bench | {out}: the base scores otherwise on pool {moved} than when this run was measured "
                      f"({base_dir} is another base); its pool rows are kept as they were")
            else:
                result["pool"] = pool
        for row in stale_splits:
            row.update(instance_gaps(paired_episodes(envs_dir, out, env, row["split"], cfg.eval.episodes,
                                                     cfg.eval.samples)))
        if stale_pool or stale_splits:
            write_json(cached, result)
        return result
    base = evaluate(overrides=overrides, envs_dir=envs_dir, policy_dir=base_dir,
                    metrics_path=str(out / "eval_base.json"), trajectories_out=str(out / "eval_base.parquet"))
    result = {"env": env, "run": env if seed is None else f"{env}/s{seed}", "wall": summary.get("wall_s", math.nan),
              "splits": [], "timing": summary["train"]}
    for split in ("val", "test"):
        paired = paired_episodes(envs_dir, out, env, split, cfg.eval.episodes, cfg.eval.samples)
        gap, paired_se = paired_gap(paired)
        result["splits"].append({
            "split": split, "random": random_success(cfg, base_policy, envs_dir, env, split),
            "base": base[env][split], "trained": summary["eval"][env][split], "gap": gap, "paired_se": paired_se,
            "ses": [mean_and_se(paired[name].to_list())[1] for name in ("base", "trained")],  # over instances
            "paired": gap / max(paired_se, 1e-9), "by_moves": success_by_moves(envs_dir, env, split, paired),
            **instance_gaps(paired)})
    result["pool"] = pool_fit(cfg, base_policy, load_policy(str(out / "policy"), device="cpu"), envs_dir, env,
                              args.steps)
    steps = [row for row in read_steps_csv(out / "train_steps.csv") if row["step"] < args.steps]  # not the final val
    result["curve"] = [row["rollout/success_rate"] for row in steps[1:]]
    result["moves"] = moves_per_step(cfg, envs_dir, env, len(steps))[1:]
    result["opening"] = {key: [row.get(key, math.nan) for row in steps[1:]] for key in OPENING if key in steps[0]}
    write_json(cached, result)
    return result


if __name__ == "__main__":
    from entry import run_main

    run_main(main, __file__)
