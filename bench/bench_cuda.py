"""The hf path on a GPU: a random Qwen2 checkpoint loaded as a user's local model, sampled, scored and trained.

    python bench/bench_cuda.py [--shape qwen2.5-0.5b|small|small-windowed] [--episodes 128] [--turns 5]
                               [--device auto]

Builds a randomly initialised Qwen2 from a config (the layer shapes of Qwen2.5-0.5B-Instruct by default, over our
byte-level tokenizer's vocabulary), saves it as a Hugging Face checkpoint directory (safetensors, tokenizer.json,
chat template) and loads it through `model.source: hf` exactly as a user's checkpoint: on CUDA when available, with
float32 weights and bfloat16 compute (`model.dtype: auto`, bf16-mixed; before 2026-12-06 the weights themselves were
bfloat16). Then, printing one line per check:
- sampling: 5-turn Sokoban episodes through the rollout (KV cache kept across turns), tokens per second, and the
  same prompt batches through transformers' `model.generate` for comparison;
- scoring: the sampled tokens re-scored in one pass; the gap to the sampling log-probs (bfloat16 rounding shows
  here; the same model in float32 must agree to 1e-4, as on the CPU);
- the critic (same backbone, scalar head): per-token values, then its warm-up as stage critic_fit runs it
  (`ragen.update.fit_values` on the filtered rollouts), with its explained variance beside the group mean's;
- two training steps (rollout, filter, critic and actor update) of each of the presets starpo_s (the warmed
  critic), starpo_ppo (KL in the reward against a frozen reference) and starpo_grpo (KL as a loss), each with
  finite losses and moved weights;
- an evaluation at temperature 0.5 as stage evaluate runs it (`ragen.evaluation.evaluate_policy`);
- the model FLOP rate against a measured bf16 matmul peak.
No download anywhere. Exits non-zero when a check fails.
"""

from __future__ import annotations

import argparse
import copy
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from bench_sampling import timed_rollout  # same folder
from ragen.advantages import group_mean_values
from ragen.config import load_config
from ragen.evaluation import evaluate_policy
from ragen.losses import explained_variance
from ragen.policy import Policy, load_policy
from ragen.policy.model import COMPUTE_DTYPE, build_critic, pick_device
from ragen.policy.sampling import left_pad
from ragen.policy.scoring import score_sequences, token_values
from ragen.policy.tokenizer import env_corpus, train_tokenizer
from ragen.records import EpisodeSpec
from ragen.train import Learner, critic_batch, select, train_step
from ragen.train import warm_critic as warm_critic_on
from ragen.update import uses_critic

COMMON = ["train.env=sokoban", "train.groups=8", "train.group_size=4", "train.mini_batch_size=8"]
SHAPES = {  # Qwen2.5-0.5B-Instruct's layer shapes (its config.json), and a small one for a quick look
    "qwen2.5-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2, max_position_embeddings=32768, rope_theta=1_000_000.0),
    "small": dict(hidden_size=192, intermediate_size=512, num_hidden_layers=4, num_attention_heads=6,
                  num_key_value_heads=2, max_position_embeddings=2048),
}
# the small shape with a sliding window of 128 slots on every other layer (as Gemma 2 and 3 and GPT-OSS mix them),
# which 5-turn Sokoban conversations outgrow
SHAPES["small-windowed"] = dict(SHAPES["small"], use_sliding_window=True, sliding_window=128,
                                layer_types=["sliding_attention", "full_attention"] * 2)


def build_checkpoint(root: Path, shape: str, **overrides: Any) -> Path:
    """A local hf checkpoint directory and a models/base-style folder whose meta points at it; `overrides` change
    the shape's config keys (`num_hidden_layers=2`: a shallower model for a CPU)."""
    tokenizer = train_tokenizer(env_corpus(["sokoban", "frozen_lake", "bandit"], 32), 1024)
    config = Qwen2Config(vocab_size=len(tokenizer), tie_word_embeddings=True, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, architectures=["Qwen2ForCausalLM"],
                         **{**SHAPES[shape], **overrides})
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(root / "checkpoint", safe_serialization=True)
    tokenizer.save_pretrained(root / "checkpoint")
    (root / "base").mkdir()
    (root / "base" / "ragen_meta.json").write_text(json.dumps({"source": "hf", "path": str(root / "checkpoint")}))
    return root / "base"


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def peak_tflops(device: torch.device, dtype: torch.dtype) -> float:
    n = 8192 if device.type == "cuda" else 1024
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    sync(device)
    start = time.perf_counter()
    for _ in range(10):
        a @ b
    sync(device)
    return 2 * n**3 * 10 / (time.perf_counter() - start) / 1e12


def rollout(policy: Policy, cfg, episodes: int, seed: int) -> tuple[list, list, float, int, float]:
    """Play `episodes` Sokoban episodes; returns trajectories, per-turn prompt batches, seconds, tokens, FLOPs."""
    specs = [EpisodeSpec("sokoban", 10_000 + i // 16, i // 16) for i in range(episodes)]
    generator = torch.Generator(policy.model.device).manual_seed(seed)
    return timed_rollout(policy, cfg.rollout, specs, generator, sync=lambda: sync(policy.model.device))


def generate_rate(policy: Policy, cfg, batches: list) -> tuple[float, int]:
    texts = policy.token_texts
    seconds, tokens = 0.0, 0
    for prompts, _ in batches:
        ids, mask = left_pad(prompts, policy.tokenizer.pad_token_id, policy.model.device)
        sync(policy.model.device)
        start = time.perf_counter()
        with torch.no_grad():
            out = policy.model.generate(
                input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
                max_new_tokens=cfg.rollout.max_new_tokens, stop_strings=["</answer>"], tokenizer=policy.tokenizer,
                eos_token_id=sorted(texts.stop_ids), pad_token_id=texts.pad_id)
        sync(policy.model.device)
        seconds += time.perf_counter() - start
        for row in out[:, ids.shape[1]:].tolist():
            tokens += next((i + 1 for i, t in enumerate(row) if t in texts.stop_ids), len(row))
    return seconds, tokens


def rescoring_gap(policy: Policy, trajectories: list) -> float:
    """Largest |sampling log-prob - re-scored log-prob| over every sampled token."""
    seqs = [list(t.token_ids) for t in trajectories]
    ids, mask = left_pad(seqs, policy.tokenizer.pad_token_id, policy.model.device)
    logprobs, _ = score_sequences(policy.model, ids, mask, with_entropy=False)
    gap = 0.0
    for row, t in enumerate(trajectories):
        offset = ids.shape[1] - len(t.token_ids)
        sampled = torch.tensor(t.sampled_mask, device=ids.device)
        theirs = torch.tensor(t.sampled_logprobs, device=ids.device)[sampled]
        ours = logprobs[row, offset:][sampled]
        gap = max(gap, float((ours - theirs).abs().max()))
    return gap


def warm_critic(cfg, policy: Policy, critic, trajectories: list) -> tuple[list[float], float, float, float]:
    """Stage critic_fit on these rollouts: filter, return targets, `critic.warmup_epochs` passes of `fit_values`.
    Returns each pass's loss, the explained variance of the warmed critic and of the group mean, and seconds."""
    kept, scores, _ = select(cfg, trajectories)
    batch, targets = critic_batch(cfg, policy, kept, scores)  # targets: (B, T)
    sync(policy.model.device)
    start = time.perf_counter()
    losses = warm_critic_on(cfg, critic, batch, targets)
    sync(policy.model.device)
    seconds = time.perf_counter() - start
    with torch.no_grad():
        values = token_values(critic, batch.input_ids, batch.attention_mask)  # (B, T)
    group = group_mean_values(targets, batch.group_ids, batch.loss_mask)  # (B, T)
    return (losses, explained_variance(values, targets, batch.loss_mask),
            explained_variance(group, targets, batch.loss_mask), seconds)


def train_preset(name: str, base: Path, args, warm_critic_model, failures: list[str]) -> Policy:
    """Two steps of preset `name` from the base, on the device; prints a line a step, returns the trained policy."""
    cfg = load_config(None, [f"preset={name}", f"rollout.max_turns={args.turns}", *COMMON])
    policy = load_policy(base, device=args.device, attn=args.attn)
    device = policy.model.device
    critic = copy.deepcopy(warm_critic_model).train() if uses_critic(cfg.algo.advantage) else None
    ref = load_policy(base, device=args.device, attn=args.attn).model if cfg.algo.kl != "none" else None
    learner = Learner(policy, critic, ref, torch.optim.AdamW(policy.model.parameters(), lr=1e-6),
                      torch.optim.AdamW(critic.parameters(), lr=1e-5) if critic is not None else None)
    before = policy.model.model.embed_tokens.weight.detach().float().clone()
    for step in range(2):
        sync(device)
        start = time.perf_counter()
        m = train_step(cfg, learner, list(range(10_000, 10_064)), step=step)
        sync(device)
        seconds = time.perf_counter() - start
        kl = f"{m['actor/kl_loss']:+.5f}" if "actor/kl_loss" in m else cfg.algo.kl
        value_loss = f"{m['critic/value_loss']:.4f}" if critic is not None else "- (no critic)"
        print(f"train     {name:<11} step {step + 1}: {seconds:5.1f} s (rollout {m['timing/rollout_s']:.1f}, score "
              f"{m['timing/score_s']:.1f}, update {m['timing/update_s']:.1f}) | kept "
              f"{m.get('filter/kept_frac', 1.0):.2f} | success {m['rollout/success_rate']:.3f} | pg_loss "
              f"{m['actor/pg_loss']:+.4f} | value_loss {value_loss} | kl "
              f"{kl} | approx_kl {m['actor/approx_kl']:+.2e} | clipfrac low/high {m['actor/clipfrac_low']:.3f}/"
              f"{m['actor/clipfrac_high']:.3f} | grad_norm {m['actor/grad_norm']:.3f}")
        checked = [m["actor/pg_loss"], m["actor/grad_norm"]] + ([m["critic/value_loss"]] if critic is not None else [])
        if not all(torch.isfinite(torch.tensor(checked))) or m["actor/skipped_steps"]:
            failures.append(f"{name} step {step + 1} gave a non-finite loss or skipped its update")
    moved = float((policy.model.model.embed_tokens.weight.detach().float() - before).abs().max())
    print(f"train     {name:<11} max weight change after 2 steps {moved:.2e}")
    if not moved > 0:
        failures.append(f"{name} left the weights unchanged")
    return policy


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-0.5b")
    parser.add_argument("--episodes", type=int, default=128)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--eval-episodes", type=int, default=64)
    parser.add_argument("--attn", choices=["auto", "sdpa", "eager"], default="auto", help="model.attn")
    args = parser.parse_args()
    device = pick_device(args.device)
    failures = []
    cfg = load_config(None, [f"rollout.max_turns={args.turns}", *COMMON])  # the default preset, starpo_s
    with tempfile.TemporaryDirectory() as tmp:
        base = build_checkpoint(Path(tmp), args.shape)
        policy = load_policy(base, device=args.device, attn=args.attn)  # the hf path: meta -> local checkpoint
        params = sum(p.numel() for p in policy.model.parameters())
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
        compute = getattr(policy.model, COMPUTE_DTYPE, None) or policy.model.dtype  # what the matmuls run in
        print(f"# hf path | random Qwen2 ({args.shape}) {params / 1e6:.1f} M params | {policy.model.device} "
              f"{policy.model.dtype} weights, {compute} compute | {policy.model.config._attn_implementation} "
              f"attention | {name} | "
              f"torch {torch.__version__}")
        if device.type == "cuda" and (policy.model.device.type, policy.model.dtype, compute) != (
                "cuda", torch.float32, torch.bfloat16):
            failures.append("the hf path did not load onto CUDA with float32 weights computing in bfloat16")

        # warm-up, untimed: CUDA context, cuBLAS handles and kernel selection belong to neither sampler
        _, warm_batches, *_ = rollout(policy, cfg, 8, seed=99)
        generate_rate(policy, cfg, warm_batches[:1])
        trajectories, batches, seconds, tokens, flops = rollout(policy, cfg, args.episodes, seed=0)
        gen_seconds, gen_tokens = generate_rate(policy, cfg, batches)
        print(f"sampling  ours (KV cache)  {tokens:>7} tokens in {seconds:6.2f} s = {tokens / seconds:8.0f} tokens/s "
              f"({args.episodes} Sokoban episodes x {args.turns} turns, {len(batches)} batches)")
        print(f"sampling  model.generate   {gen_tokens:>7} tokens in {gen_seconds:6.2f} s = "
              f"{gen_tokens / gen_seconds:8.0f} tokens/s (same prompt batches)")
        gap = rescoring_gap(policy, trajectories)
        print(f"scoring   {compute}: max |sampling - rescoring| log-prob {gap:.4f}")

        exact = load_policy(base, device=args.device, dtype="float32", attn=args.attn)
        exact_trajs, *_ = rollout(exact, cfg, min(args.episodes, 16), seed=1)
        exact_gap = rescoring_gap(exact, exact_trajs)
        print(f"scoring   torch.float32: max |sampling - rescoring| log-prob {exact_gap:.2e} (must be < 1e-4)")
        if not exact_gap < 1e-4:
            failures.append(f"float32 rescoring differs from sampling by {exact_gap:.2e}")
        del exact

        critic = build_critic(policy.model)
        ids, mask = left_pad([list(t.token_ids) for t in trajectories[:8]], policy.tokenizer.pad_token_id, device)
        with torch.no_grad():
            values = token_values(critic, ids, mask)
        print(f"critic    values {tuple(values.shape)} {values.dtype} on {values.device}, all zero at init: "
              f"{bool((values == 0).all())}")

        losses, critic_ev, group_ev, warm_s = warm_critic(cfg, policy, critic, trajectories)
        print(f"critic_fit {len(losses)} passes in {warm_s:.1f} s: value loss {losses[0]:.4f} -> {losses[-1]:.4f}, "
              f"explained variance {critic_ev:+.3f} (the group mean's {group_ev:+.3f})")
        if not (all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0]):
            failures.append(f"the critic warm-up did not lower its value loss ({losses[0]:.4f} -> {losses[-1]:.4f})")

        # the rollout's sampler and the presets' trainers: fresh policies from the same checkpoint
        peak = peak_tflops(device, compute)
        del policy
        for name in ("starpo_s", "starpo_ppo", "starpo_grpo"):
            trained = train_preset(name, base, args, critic, failures)  # frees the last preset's policy
        val = list(range(20_000, 20_000 + args.eval_episodes))
        sync(device)
        start = time.perf_counter()
        summary, evaluated = evaluate_policy(trained, "sokoban", val, cfg.rollout, temperature=0.5, seed=0)
        sync(device)
        print(f"evaluate  starpo_grpo's policy on {len(evaluated)} sokoban episodes at T 0.5 in "
              f"{time.perf_counter() - start:.1f} s: success {summary['success_rate']:.3f} "
              f"± {summary['success_se']:.3f}, mean return {summary['return_mean']:+.3f}, valid turns "
              f"{summary['format_valid_rate']:.3f}")
        if len(evaluated) != len(val) or not torch.isfinite(torch.tensor(summary["return_mean"])):
            failures.append("the evaluation did not play every episode or gave a non-finite return")

        achieved = flops / seconds / 1e12
        print(f"FLOPs     sampling {achieved:.3f} TFLOP/s = {achieved / peak:.2%} of a measured "
              f"{compute} matmul peak of {peak:.1f} TFLOP/s")
    for failure in failures:
        print(f"FAILED: {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    from entry import run_main

    run_main(main, __file__)
