"""Sampling throughput: our KV-cache sampler against transformers' `model.generate`, same model, same prompts.

    python bench/bench_sampling.py [--model models/base] [--episodes 128] [--turns 5]

Plays `--episodes` 5-turn Sokoban episodes with our sampler (one batch per turn), records every turn's prompt
batch, then replays those exact prompt batches through `model.generate` (sampling at temperature 1, stop string
"</answer>", the end-of-turn ids as eos). Prints generated tokens per second for both, and the fraction of the
machine's peak FP32 FLOP rate reached (model FLOPs from parameter count and context length; peak both measured
with a large matmul and from the CPU's vector width x clock).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Callable

import torch

from ragen.config import RolloutConfig, load_config
from ragen.policy import Policy, load_policy
from ragen.policy.model import build_tiny_model
from ragen.policy.sampling import left_pad
from ragen.policy.tokenizer import env_corpus, train_tokenizer
from ragen.records import EpisodeSpec
from ragen.rollout import policy_responder, run_episodes


def load_or_build(path: str) -> tuple[Policy, str]:
    if Path(path, "config.json").exists():
        return load_policy(path, device="cpu"), f"{path} (trained)"
    cfg = load_config("params.yaml").model
    tokenizer = train_tokenizer(env_corpus(["sokoban"], 32), cfg.vocab_size)
    model = build_tiny_model(tokenizer, **cfg.tiny_shape(), seed=0)
    return Policy(model.eval(), tokenizer), "untrained tiny model (run `dvc repro base` for the trained one)"


def measured_peak_gflops(n: int = 2048, reps: int = 5) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    start = time.perf_counter()
    for _ in range(reps):
        a @ b
    return 2 * n**3 * reps / (time.perf_counter() - start) / 1e9


def theoretical_peak_gflops() -> tuple[float, str]:
    flags = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    mhz = next((float(line.split(":")[1]) for line in flags.splitlines() if line.startswith("cpu MHz")), 0.0)
    lanes = 16 if "avx512f" in flags else 8 if "avx2" in flags else 4
    per_cycle = 2 * 2 * lanes  # two FMA units x (multiply + add) x fp32 lanes
    cores = torch.get_num_threads()
    return cores * mhz / 1e3 * per_cycle, f"{cores} cores x {mhz / 1e3:.2f} GHz x {per_cycle} FP32 FLOP/cycle"


def model_flops(model, contexts: list[int], tokens: list[int]) -> float:
    """Forward FLOPs of running `tokens[i]` tokens on top of `contexts[i]` cached ones, per row:
    2 x params per token plus attention (QK^T and AV) over everything before it."""
    cfg = model.config
    params = sum(p.numel() for p in model.parameters())
    attn = 4 * cfg.num_hidden_layers * cfg.hidden_size
    return sum(2 * params * n + attn * (c * n + n * (n + 1) / 2) for c, n in zip(contexts, tokens))


def timed_rollout(policy: Policy, cfg: RolloutConfig, specs: list[EpisodeSpec], generator: torch.Generator,
                  sync: Callable[[], None] = lambda: None) -> tuple[list, list, float, int, float]:
    """Play `specs` with our sampler (one batch per turn); returns the trajectories, each turn's (prompts,
    sampled lengths), the sampling seconds, the sampled tokens and the model FLOPs our KV-cache session ran.
    `sync` waits for the device before each clock read (CUDA)."""
    batches, seconds, tokens, flops, fed = [], 0.0, 0, 0.0, {}
    sampler = policy_responder(policy, cfg, generator=generator)

    def timed(prompts, envs):
        nonlocal seconds, tokens, flops
        sync()
        start = time.perf_counter()
        samples = sampler(prompts, envs)
        sync()
        seconds += time.perf_counter() - start
        tokens += sum(len(s.token_ids) for s in samples)
        batches.append(([list(p) for p in prompts], [len(s.token_ids) for s in samples]))
        # what our session ran: each row's new prompt tokens on top of its cache (a first prompt shared by several
        # rows once), then the sampled tokens
        before = [fed.get(id(env), 0) for env in envs]
        fresh = {tuple(p) for p, b in zip(prompts, before) if b == 0}
        fed_rows = [(b, len(p) - b) for p, b in zip(prompts, before) if b > 0] + [(0, len(p)) for p in fresh]
        flops += model_flops(policy.model, [b for b, _ in fed_rows], [n for _, n in fed_rows])
        flops += model_flops(policy.model, [len(p) for p in prompts], [len(s.token_ids) for s in samples])
        for env, p, s in zip(envs, prompts, samples):
            fed[id(env)] = len(p) + len(s.token_ids) - 1
        return samples

    trajectories = run_episodes(specs, timed, policy.renderer(True), cfg,
                                max_positions=policy.max_positions)
    return trajectories, batches, seconds, tokens, flops


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="models/base")
    parser.add_argument("--episodes", type=int, default=128)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--env", default="sokoban")
    args = parser.parse_args()
    torch.manual_seed(0)
    policy, source = load_or_build(args.model)
    cfg = RolloutConfig(max_turns=args.turns)
    texts, stop_ids = policy.token_texts, sorted(policy.token_texts.stop_ids)
    print(f"# sampling benchmark | {source} | {sum(p.numel() for p in policy.model.parameters()) / 1e6:.2f} M params | "
          f"{args.episodes} {args.env} episodes x {args.turns} turns | torch threads {torch.get_num_threads()}")

    specs = [EpisodeSpec(args.env, 10_000 + i // 16, i // 16) for i in range(args.episodes)]
    _, batches, ours_time, ours_tokens, ours_flops = timed_rollout(policy, cfg, specs, torch.Generator().manual_seed(0))

    gen_time, gen_tokens = 0.0, 0
    for prompts, _ in batches:
        ids, mask = left_pad(prompts, policy.tokenizer.pad_token_id, policy.model.device)
        start = time.perf_counter()
        with torch.no_grad():
            out = policy.model.generate(
                input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
                max_new_tokens=cfg.max_new_tokens, stop_strings=["</answer>"], tokenizer=policy.tokenizer,
                eos_token_id=stop_ids, pad_token_id=texts.pad_id)
        gen_time += time.perf_counter() - start
        new = out[:, ids.shape[1]:]
        for row in new.tolist():  # count up to and including the first stop (eos id) or to the end
            count = next((i + 1 for i, t in enumerate(row) if t in texts.stop_ids), len(row))
            gen_tokens += count

    # generate re-runs every turn's whole prompt (no cache across calls), as RAGEN's rollout does
    gen_flops = sum(model_flops(policy.model, [0] * len(prompts), [len(p) for p in prompts])
                    + model_flops(policy.model, [len(p) for p in prompts], lens) for prompts, lens in batches)
    measured = measured_peak_gflops()
    theoretical, how = theoretical_peak_gflops()
    ours_rate, gen_rate = ours_tokens / ours_time, gen_tokens / gen_time
    achieved = ours_flops / ours_time / 1e9
    print(f"ours (KV cache)     {ours_tokens:>7} tokens in {ours_time:6.2f} s = {ours_rate:8.0f} tokens/s")
    print(f"model.generate      {gen_tokens:>7} tokens in {gen_time:6.2f} s = {gen_rate:8.0f} tokens/s")
    print(f"speedup             {ours_rate / gen_rate:.2f}x (tokens/s), {gen_time / ours_time:.2f}x (wall time)")
    print(f"model FLOPs         ours {ours_flops / 1e9:.1f} GFLOP (cache kept across turns) -> {achieved:.1f} GFLOP/s;"
          f" generate {gen_flops / 1e9:.1f} GFLOP -> {gen_flops / gen_time / 1e9:.1f} GFLOP/s")
    print(f"peak FP32           measured matmul {measured:.0f} GFLOP/s; theoretical {theoretical:.0f} GFLOP/s ({how})")
    print(f"fraction of peak    ours {achieved / measured:.1%} of measured, {achieved / theoretical:.1%} of theoretical;"
          f" generate {gen_flops / gen_time / 1e9 / measured:.1%} of measured")


if __name__ == "__main__":
    from entry import run_main

    run_main(main, __file__)
