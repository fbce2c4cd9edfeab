"""What `rollout.max_episodes_per_pass` saves: the peak memory and the time of one evaluation's sampling, by limit.

    python bench/bench_sampling_memory.py [--model models/base] [--env sokoban] [--episodes 256] [--turns 5]
                                          [--limits 0 64 16]

Plays `--episodes` episodes of `--env` (seeds 10,000 on, one per episode) at temperature 0.5 through
`ragen.evaluation.evaluate_policy`, as stage evaluate plays a split, with `rollout.max_episodes_per_pass` at each
of `--limits` (0: all at once, the default), each limit in a fresh process so that each peak resident memory is its
own. A sampling session holds a KV cache of every sequence it plays, and a pass plays its episodes to their end, so
the cache grows to the pass's episodes x their longest sequence: the table prints that estimate (keys and values of
every layer, in the model's dtype) beside the measured peak over the process's peak after loading the model, the
seconds, the sampled tokens per second and the success rate. The passes draw other random numbers than one batch,
so success moves within its standard error from limit to limit. `--model` is a policy directory (the warm base by
default; a local real LLM's path is read the same way); without one an untrained tiny model of params.yaml's shape is
built.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from bench_micro_batch import child_result, rss_gib  # same folder
from bench_sampling import load_or_build
from ragen.config import RolloutConfig
from ragen.evaluation import evaluate_policy


def kv_bytes_per_token(model) -> int:
    """Keys and values of every layer for one token: 2 x layers x kv heads x head dim x the element size."""
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    return 2 * cfg.num_hidden_layers * kv_heads * head_dim * next(model.parameters()).element_size()


def measure(model: str, env: str, episodes: int, turns: int, limit: int) -> dict[str, float]:
    """One evaluation of `episodes` episodes in passes of at most `limit` (0: one pass), in this process."""
    policy, source = load_or_build(model)
    cfg = RolloutConfig(max_turns=turns, max_episodes_per_pass=limit)
    before = rss_gib() * 1024
    start = time.perf_counter()
    summary, trajectories = evaluate_policy(policy, env, list(range(10_000, 10_000 + episodes)), cfg,
                                            temperature=0.5, seed=0)
    seconds = time.perf_counter() - start
    pass_size, lengths = limit or episodes, [len(t.token_ids) for t in trajectories]  # one episode per seed
    longest_pass = max(max(lengths[s : s + pass_size]) for s in range(0, episodes, pass_size))
    return {"source": source, "seconds": seconds, "rss_before_mib": before, "rss_peak_mib": rss_gib() * 1024,
            "passes": -(-episodes // pass_size), "kv_mib": min(pass_size, episodes) * longest_pass
            * kv_bytes_per_token(policy.model) / 2**20, "longest": max(lengths),
            "tokens": sum(len(turn.response_ids) for t in trajectories for turn in t.turns),
            "success": summary["success_rate"], "success_se": summary["success_se"]}


def run_child(limit: int, args: argparse.Namespace) -> dict[str, float] | str:
    """`measure` in a fresh process (`child_result`)."""
    return child_result([str(Path(__file__).resolve()), "--child", str(limit), "--model", args.model, "--env", args.env,
                         "--episodes", str(args.episodes), "--turns", str(args.turns)], f"limit {limit}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="models/base")
    parser.add_argument("--env", default="sokoban")
    parser.add_argument("--episodes", type=int, default=256)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--limits", type=int, nargs="*", default=[0, 64, 16], help="max episodes per pass; 0: all")
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.episodes < 1 or args.turns < 1 or any(k < 0 for k in args.limits):
        parser.error("--episodes and --turns must be at least 1 and each of --limits at least 0")
    if args.child is not None:
        print(json.dumps(measure(args.model, args.env, args.episodes, args.turns, args.child)))
        return 0
    print(f"# {args.episodes} {args.env} episodes of up to {args.turns} turns at T 0.5, evaluate_policy in passes of "
          f"rollout.max_episodes_per_pass; each row a fresh process; memory: the process's peak resident set over its "
          f"peak after loading the model; {torch.get_num_threads()} CPU threads")
    print("| episodes per pass | passes | KV cache of a pass (MiB, est.) | peak over the loaded model (MiB) "
          "| peak (MiB) | sampling s | sampled tokens/s | success (SE) |")
    print("|---|---|---|---|---|---|---|---|")
    for limit in args.limits:
        m = run_child(limit, args)
        label = f"{min(limit, args.episodes)}" if limit else f"all ({args.episodes})"
        if isinstance(m, str):
            print(f"| {label} | | | {m} | | | | |", flush=True)
            continue
        print(f"| {label} | {m['passes']} | {m['kv_mib']:.1f} | {m['rss_peak_mib'] - m['rss_before_mib']:.0f} | "
              f"{m['rss_peak_mib']:.0f} | {m['seconds']:.1f} | {m['tokens'] / m['seconds']:.0f} | "
              f"{m['success']:.3f} ({m['success_se']:.3f}) |", flush=True)
    print(f"# model: {m['source'] if isinstance(m, dict) else args.model}; longest episode: "
          f"{m['longest'] if isinstance(m, dict) else '?'} tokens")
    return 0


if __name__ == "__main__":
    from entry import run_main

    run_main(main, __file__)
