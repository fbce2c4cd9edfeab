"""The hf path on a GPU: a random Qwen2 checkpoint loaded as a user's local model, sampled, scored and trained.

    python bench/bench_cuda.py [--shape qwen2.5-0.5b|small] [--episodes 128] [--turns 5] [--device auto]

Builds a randomly initialised Qwen2 from a config (the layer shapes of Qwen2.5-0.5B-Instruct by default, over our
byte-level tokenizer's vocabulary), saves it as a Hugging Face checkpoint directory (safetensors, tokenizer.json,
chat template) and loads it through `model.source: hf` exactly as a user's checkpoint: CUDA and bfloat16 when
available. Then, printing one line per check:
- sampling: 5-turn Sokoban episodes through the rollout (KV cache kept across turns), tokens per second, and the
  same prompt batches through transformers' `model.generate` for comparison;
- scoring: the sampled tokens re-scored in one pass; the gap to the sampling log-probs (bfloat16 rounding shows
  here; the same model in float32 must agree to 1e-4, as on the CPU);
- the critic (same backbone, scalar head): per-token values;
- one StarPO-S training step (rollout, filter, critic and actor update) with finite losses and moved weights;
- the model FLOP rate against a measured bf16 matmul peak.
No download anywhere. Exits non-zero when a check fails.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from bench_sampling import timed_rollout  # same folder
from ragen.config import load_config
from ragen.policy import Policy, load_policy
from ragen.policy.model import build_critic, pick_device
from ragen.policy.sampling import left_pad
from ragen.policy.scoring import score_sequences, token_values
from ragen.policy.tokenizer import env_corpus, train_tokenizer
from ragen.records import EpisodeSpec
from ragen.train import Learner, train_step

SHAPES = {  # Qwen2.5-0.5B-Instruct's layer shapes (its config.json), and a small one for a quick look
    "qwen2.5-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2, max_position_embeddings=32768, rope_theta=1_000_000.0),
    "small": dict(hidden_size=192, intermediate_size=512, num_hidden_layers=4, num_attention_heads=6,
                  num_key_value_heads=2, max_position_embeddings=2048),
}


def build_checkpoint(root: Path, shape: str) -> Path:
    """A local hf checkpoint directory and a models/base-style folder whose meta points at it."""
    tokenizer = train_tokenizer(env_corpus(["sokoban", "frozen_lake", "bandit"], 32), 1024)
    config = Qwen2Config(vocab_size=len(tokenizer), tie_word_embeddings=True, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, architectures=["Qwen2ForCausalLM"], **SHAPES[shape])
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-0.5b")
    parser.add_argument("--episodes", type=int, default=128)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--attn", choices=["auto", "sdpa", "eager"], default="auto", help="model.attn")
    args = parser.parse_args()
    device = pick_device(args.device)
    failures = []
    cfg = load_config(None, [f"rollout.max_turns={args.turns}", "train.env=sokoban", "train.groups=8",
                             "train.group_size=4", "train.mini_batch_size=8", "filter.keep_ratio=0.5"])
    with tempfile.TemporaryDirectory() as tmp:
        base = build_checkpoint(Path(tmp), args.shape)
        policy = load_policy(base, device=args.device, attn=args.attn)  # the hf path: meta -> local checkpoint
        params = sum(p.numel() for p in policy.model.parameters())
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
        print(f"# hf path | random Qwen2 ({args.shape}) {params / 1e6:.1f} M params | {policy.model.device} "
              f"{policy.model.dtype} | {policy.model.config._attn_implementation} attention | {name} | "
              f"torch {torch.__version__}")
        if device.type == "cuda" and (policy.model.device.type, policy.model.dtype) != ("cuda", torch.bfloat16):
            failures.append("the hf path did not load onto CUDA in bfloat16")

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
        print(f"scoring   {policy.model.dtype}: max |sampling - rescoring| log-prob {gap:.4f}")

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

        learner = Learner(policy, critic.train(), None, torch.optim.AdamW(policy.model.parameters(), lr=1e-6),
                          torch.optim.AdamW(critic.parameters(), lr=1e-5))
        before = policy.model.model.embed_tokens.weight.detach().float().clone()
        policy.model.train()
        sync(device)
        start = time.perf_counter()
        metrics = train_step(cfg, learner, list(range(10_000, 10_064)), step=0)
        sync(device)
        moved = float((policy.model.model.embed_tokens.weight.detach().float() - before).abs().max())
        print(f"train     one StarPO-S step (8 x 4 rollouts, keep 0.5) in {time.perf_counter() - start:.1f} s: "
              f"pg_loss {metrics['actor/pg_loss']:.4f}, value_loss {metrics['critic/value_loss']:.4f}, "
              f"grad_norm {metrics['actor/grad_norm']:.3f}, max weight change {moved:.2e}; timing rollout "
              f"{metrics['timing/rollout_s']:.1f} s score {metrics['timing/score_s']:.1f} s update "
              f"{metrics['timing/update_s']:.1f} s")
        finite = all(torch.isfinite(torch.tensor(metrics[k])) for k in ("actor/pg_loss", "critic/value_loss"))
        if not (finite and moved > 0):
            failures.append("the training step gave a non-finite loss or left the weights unchanged")

        peak = peak_tflops(device, policy.model.dtype)
        achieved = flops / seconds / 1e12
        print(f"FLOPs     sampling {achieved:.3f} TFLOP/s = {achieved / peak:.2%} of a measured "
              f"{policy.model.dtype} matmul peak of {peak:.1f} TFLOP/s")
    for failure in failures:
        print(f"FAILED: {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
