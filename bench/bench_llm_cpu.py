"""What one StarPO-S step costs on this machine's CPU at a real LLM's size, beside the embedded tiny policy.

    python bench/bench_llm_cpu.py [--shapes tiny qwen2.5-0.5b] [--groups 2] [--group-size 4] [key=value ...]

For each model, built at random here (no download) and run in float32 on the CPU as the pipeline runs it: the tiny
policy of params `model`, and a Qwen2 with Qwen2.5-0.5B-Instruct's layer shapes and vocabulary size (494 M
parameters: bench_cuda's shape over a 151,936-row tied embedding, of which our tokenizer uses the first rows, so the
logits cost what the real model's do). Each runs one StarPO-S step of the training loop (`ragen.train.train_step`:
rollout, filter, scoring, critic and actor update) on `--groups` x `--group-size` Sokoban episodes, and prints its
seconds split into rollout, scoring and update with tokens per second for each. Then it scales the step to the
pipeline's size (params `train.groups` x `train.group_size` episodes, `filter.keep_ratio` of the groups trained):
rollout by the episodes played, scoring and update by the sequences trained, and prints how many such steps fit in
30 minutes (RAGEN trains 200). The scaling is linear (a larger batch samples somewhat faster), and a random model's
responses stop at `rollout.max_new_tokens` tokens a turn or earlier, where RAGEN lets Qwen2.5-0.5B write up to 400:
for the real model the step takes longer still. The tiny policy's row is there to check the scaling against the
steps the learning benchmarks measured.
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from bench_cuda import SHAPES  # same folder
from ragen.config import load_config
from ragen.policy import Policy
from ragen.policy.model import build_critic, build_tiny_model
from ragen.policy.tokenizer import env_corpus, train_tokenizer
from ragen.train import Learner, train_step

QWEN_VOCAB = 151_936  # Qwen2.5-0.5B-Instruct's config.json
BUDGET_S = 30 * 60


def build_policy(shape: str, cfg, tokenizer) -> Policy:
    if shape == "tiny":
        model = build_tiny_model(tokenizer, **cfg.model.tiny_shape(), seed=0)
    else:
        vocab = max(QWEN_VOCAB, len(tokenizer)) if shape == "qwen2.5-0.5b" else len(tokenizer)
        config = Qwen2Config(vocab_size=vocab, tie_word_embeddings=True, eos_token_id=tokenizer.eos_token_id,
                             pad_token_id=tokenizer.pad_token_id, **SHAPES[shape])
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(config)
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    return Policy(model.eval(), tokenizer)


def measure(shape: str, cfg, tokenizer) -> dict[str, float]:
    """One train_step of `cfg` on a fresh random model of `shape`: its metrics (timing/, perf/, filter/), with the
    step's seconds (`step_s`) and the model's parameters in millions (`params_m`)."""
    policy = build_policy(shape, cfg, tokenizer)
    critic = build_critic(policy.model).train()
    learner = Learner(policy, critic, None, torch.optim.AdamW(policy.model.parameters(), lr=cfg.train.lr),
                      torch.optim.AdamW(critic.parameters(), lr=cfg.critic.lr))
    start = time.perf_counter()
    metrics = train_step(cfg, learner, list(range(10_000, 10_000 + cfg.train.groups)), step=0)
    metrics["step_s"] = time.perf_counter() - start
    metrics["params_m"] = sum(p.numel() for p in policy.model.parameters()) / 1e6
    return metrics


def scaled_step_s(m: dict[str, float], episodes: int, rows: int, full_episodes: int, full_rows: int) -> float:
    """A step of `full_episodes` played and `full_rows` trained from one of `episodes` and `rows`: rollout seconds
    scale with the episodes, scoring and update seconds with the sequences trained."""
    return (m["timing/rollout_s"] * full_episodes / episodes
            + (m["timing/score_s"] + m["timing/update_s"]) * full_rows / rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=["tiny", "qwen2.5-0.5b"], choices=["tiny", *sorted(SHAPES)])
    parser.add_argument("--groups", type=int, default=2)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--mini-batch", type=int, default=2, help="sequences a pass (0.5B's fp32 actor and critic "
                        "with AdamW hold 16 GB before activations)")
    parser.add_argument("overrides", nargs="*", help="params.yaml overrides (key=value) for the measured step")
    args = parser.parse_args()
    full = load_config("params.yaml", ["preset=starpo_s", "train.env=sokoban", *args.overrides])
    cfg = load_config("params.yaml", ["preset=starpo_s", "train.env=sokoban", *args.overrides,
                                      f"train.groups={args.groups}", f"train.group_size={args.group_size}",
                                      "filter.keep_ratio=0.5", f"train.mini_batch_size={args.mini_batch}"])
    kept_groups = max(int(full.filter.keep_ratio * full.train.groups), 1)
    full_episodes, full_rows = full.train.groups * full.train.group_size, kept_groups * full.train.group_size
    tokenizer = train_tokenizer(env_corpus(list(full.envs.tags), full.base.tokenizer_episodes, seed=full.base.seed),
                                full.model.vocab_size, grid_tokens=full.model.grid_tokens)
    print(f"# one StarPO-S step on {args.groups} x {args.group_size} Sokoban episodes, half the groups trained, "
          f"float32 on {torch.get_num_threads()} CPU threads (torch {torch.__version__}); scaled to "
          f"{full.train.groups} x {full.train.group_size} episodes with {full_rows} sequences trained")
    print("| model | params (M) | rollout s (tokens/s) | scoring s (tokens/s) | update s (tokens/s) | step s | "
          "scaled step s | scaled steps in 30 min |")
    print("|---|---|---|---|---|---|---|---|")
    for shape in args.shapes:
        m = measure(shape, cfg, tokenizer)
        rows = round(m["filter/kept_frac"] * args.groups * args.group_size)  # the kept half of the groups
        scaled = scaled_step_s(m, args.groups * args.group_size, rows, full_episodes, full_rows)
        print(f"| {shape} | {m['params_m']:.1f} | {m['timing/rollout_s']:.1f} ({m['perf/rollout_tokens_per_s']:.0f}) "
              f"| {m['timing/score_s']:.1f} ({m['perf/score_tokens_per_s']:.0f}) | {m['timing/update_s']:.1f} "
              f"({m['perf/update_tokens_per_s']:.0f}) | {m['step_s']:.1f} | {scaled:.0f} | {BUDGET_S / scaled:.1f} |",
              flush=True)
    return 0


if __name__ == "__main__":
    from entry import run_main

    run_main(main, __file__)
