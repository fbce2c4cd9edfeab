"""What `train.micro_batch_size` and `train.micro_batch_tokens` save: the memory of one StarPO-S update at a real
LLM's vocabulary, by micro-batch limit.

    python bench/bench_micro_batch.py [--micro 0 4 1] [--budgets 2048] [--rows 16] [--tokens 512] [--shortest 0.5]
                                      [--layers 2] [--device cpu|cuda] [--dtype float32|bf16-mixed]

One critic-and-actor update (`ragen.update.update`, StarPO-S: GAE with the critic, clip 0.2 / 0.28, entropy bonus,
`--dtype`, float32 by default, one mini-batch of `--rows` sequences) on a random Qwen2 with Qwen2.5-0.5B-Instruct's
width and its 151,936-row tied embedding, `--layers` of its 24 layers deep (the vocabulary's logits, which a pass
holds for every token it runs, do not depend on the depth; the layers' activations grow with it). The batch is
synthetic and shaped like the pipeline's: left-padded rows of `--shortest x --tokens` to `--tokens` tokens behind
one shared prompt of 64 tokens, the response tokens trained, two groups with a spread of returns. Each `--micro`
(rows per forward and backward pass; 0: the whole mini-batch in one) and each `--budgets` (padded tokens per pass,
`train.micro_batch_tokens`: short rows pack densely, long ones run alone) runs in a fresh process, so each peak
resident memory is its own, and the table prints it beside the update's seconds and the gradient norms: accumulation
is exact, so the norms agree to float rounding whatever the passes. RAGEN trains Qwen2.5-0.5B with mini-batches of
32 sequences of up to 3,600 tokens in micro-batches of 1 (or 4): one pass of a whole mini-batch there would hold 70
GB of float32 logits. On a GPU, `--device cuda --dtype bf16-mixed --layers 24 --rows 32 --tokens 3600 --shortest 0.2
--micro 1 4 --budgets 16384 32768` runs RAGEN's own shape (Qwen2.5-0.5B whole, its mini-batch of 32, its 3,600-token
limit; peak memory is then the device's allocated peak): whether passes packed by tokens beat passes of one there.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from dataclasses import fields
from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from bench_cuda import SHAPES  # same folder
from bench_llm_cpu import QWEN_VOCAB
from ragen.batching import RolloutBatch
from ragen.policy.model import build_critic, pick_precision, set_compute_dtype
from ragen.update import UpdateSettings, micro_batches, update

PROMPT = 64  # tokens of the shared prompt


def synthetic_batch(rows: int, tokens: int, vocab: int, seed: int = 0, shortest: float = 0.5) -> RolloutBatch:
    """`rows` left-padded sequences of `shortest` x `tokens` .. `tokens` tokens, evenly spread: one shared prompt of
    PROMPT tokens, then response tokens (trained); two groups, the return on each row's last token spread over
    -1 .. 1."""
    low = int(tokens * shortest)
    if low <= PROMPT:
        raise ValueError(f"--tokens {tokens} x --shortest {shortest}: the shortest row must outlast the "
                         f"{PROMPT}-token prompt")
    gen = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, vocab, (PROMPT,), generator=gen)
    lengths = torch.linspace(low, tokens, rows).round().long()
    ids = torch.zeros(rows, tokens, dtype=torch.long)
    attention = torch.zeros(rows, tokens, dtype=torch.long)
    loss_mask = torch.zeros(rows, tokens, dtype=torch.bool)
    rewards = torch.zeros(rows, tokens)
    returns = torch.linspace(-1, 1, rows)
    for row, length in enumerate(lengths.tolist()):
        start = tokens - length
        ids[row, start:start + PROMPT] = prompt
        ids[row, start + PROMPT:] = torch.randint(0, vocab, (length - PROMPT,), generator=gen)
        attention[row, start:] = 1
        loss_mask[row, start + PROMPT:] = True
        rewards[row, -1] = returns[row]
    turn_ends = torch.zeros(rows, tokens, dtype=torch.bool)
    turn_ends[:, -1] = True
    return RolloutBatch(ids, attention, loss_mask, torch.zeros(rows, tokens), rewards, returns,
                        torch.arange(rows) * 2 // rows, turn_ends)


def build_model(layers: int, vocab: int, shape: str) -> Qwen2ForCausalLM:
    """bench_cuda's `shape`, `layers` deep, over `vocab` output rows (tied to the embedding)."""
    config = Qwen2Config(vocab_size=vocab, tie_word_embeddings=True, **{**SHAPES[shape], "num_hidden_layers": layers})
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config).eval()


def rss_gib() -> float:
    """This process's peak resident memory so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def peak_gib(device: torch.device) -> float:
    """The peak memory so far: the process's resident set on the CPU, the device's allocated bytes on CUDA."""
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else rss_gib()


def measure(micro: int, budget: int, rows: int, tokens: int, layers: int, vocab: int = QWEN_VOCAB,
            shape: str = "qwen2.5-0.5b", shortest: float = 0.5, device: str = "cpu", dtype: str = "float32"
            ) -> dict[str, float]:
    """One update of a fresh model in passes of at most `micro` rows and `budget` padded tokens (0: no limit), on
    `device` at `model.dtype` `dtype`: seconds, peak memory before and after, and the update's metrics."""
    where = torch.device(device)
    weights, compute = pick_precision(where, dtype)
    model = set_compute_dtype(build_model(layers, vocab, shape).to(where, weights), compute)
    critic = build_critic(model).eval()
    batch = synthetic_batch(rows, tokens, vocab, shortest=shortest)
    batch = RolloutBatch(*(getattr(batch, f.name).to(where) for f in fields(batch)))
    settings = UpdateSettings(advantage="gae", gamma=1.0, lam=1.0, turn_gamma=0.95, eps_low=0.2, eps_high=0.28,
                              dual_clip=None, entropy_coef=0.001, kl_loss=None, kl_coef=0.0, value_clip=0.5,
                              aggregation="token-mean", mini_batch_size=rows, grad_clip=1.0,
                              micro_batch_size=micro, micro_batch_tokens=budget)
    actor_opt = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.01)
    critic_opt = torch.optim.AdamW(critic.parameters(), lr=1e-5, weight_decay=0.01)
    before = peak_gib(where)
    start = time.perf_counter()
    stats = update(model, critic, actor_opt, critic_opt, batch, settings)  # its .item() calls wait for the device
    seconds = time.perf_counter() - start
    return {"micro": micro, "budget": budget, "seconds": seconds, "rss_before_gib": before,
            "rss_peak_gib": peak_gib(where),
            "tokens": int(batch.attention_mask.sum()), "params_m": sum(p.numel() for p in model.parameters()) / 1e6,
            **{k: stats[k] for k in ("actor/pg_loss", "actor/grad_norm", "actor/entropy", "critic/value_loss",
                                     "critic/grad_norm")}}


def child_result(argv: list[str], label: str) -> dict[str, float] | str:
    """The json object a script prints last, run with `argv` in a fresh Python process (so its peak memory is its
    own), or why it did not finish (killed by the kernel for memory, say); a failure's stderr tail goes to ours,
    after `label`. bench_sampling_memory's children run through it too."""
    done = subprocess.run([sys.executable, *argv], capture_output=True, text=True)
    if done.returncode != 0:
        print(f"# {label}: exit code {done.returncode}: {done.stderr.strip()[-300:]}", file=sys.stderr)
        return (f"killed by signal {-done.returncode}" if done.returncode < 0
                else f"failed (exit code {done.returncode})")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_child(micro: int, budget: int, args: argparse.Namespace) -> dict[str, float] | str:
    """`measure` in a fresh process (`child_result`)."""
    return child_result([str(Path(__file__).resolve()), "--child", str(micro), str(budget), "--rows", str(args.rows),
                         "--tokens", str(args.tokens), "--shortest", str(args.shortest), "--layers", str(args.layers),
                         "--vocab", str(args.vocab), "--shape", args.shape, "--device", args.device,
                         "--dtype", args.dtype], f"micro {micro}, budget {budget}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--micro", type=int, nargs="*", default=[0, 4, 1], help="rows per pass; 0: all")
    parser.add_argument("--budgets", type=int, nargs="*", default=[2048], help="padded tokens per pass")
    parser.add_argument("--rows", type=int, default=16, help="sequences in the mini-batch")
    parser.add_argument("--tokens", type=int, default=512, help="the longest sequence's tokens")
    parser.add_argument("--shortest", type=float, default=0.5, help="the shortest sequence, a fraction of --tokens")
    parser.add_argument("--layers", type=int, default=2, help="of Qwen2.5-0.5B's 24")
    parser.add_argument("--vocab", type=int, default=QWEN_VOCAB, help="output rows (Qwen2.5-0.5B's by default)")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-0.5b", help="bench_cuda's shapes")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--dtype", choices=["float32", "bf16-mixed"], default="float32", help="model.dtype")
    parser.add_argument("--child", type=int, nargs=2, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if int(args.tokens * args.shortest) <= PROMPT:
        parser.error(f"--tokens x --shortest must be over {PROMPT}: the shortest row holds the {PROMPT}-token "
                     "prompt and at least one response token")
    if args.child is not None:
        print(json.dumps(measure(*args.child, args.rows, args.tokens, args.layers, args.vocab, args.shape,
                                 args.shortest, args.device, args.dtype)))
        return 0
    lengths = synthetic_batch(args.rows, args.tokens, 2, shortest=args.shortest).attention_mask.sum(-1)
    print(f"# one StarPO-S update (critic and actor), a mini-batch of {args.rows} sequences of "
          f"{int(lengths.min())} to {int(lengths.max())} tokens, shape {args.shape}, vocabulary {args.vocab:,}, "
          f"{args.layers} layers, {args.dtype} on "
          + (torch.cuda.get_device_name() if args.device == "cuda" else f"{torch.get_num_threads()} CPU threads")
          + f" (torch {torch.__version__}); each row a fresh process; peak memory: "
          + ("the device's allocated peak" if args.device == "cuda" else "the process's resident set"))
    print("| passes of at most | passes | float32 logits of the largest (MiB) | peak memory (GiB) "
          "| before the update (GiB) | update s | tokens/s | actor grad norm | critic grad norm | value loss |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for micro, budget in [(m, 0) for m in args.micro] + [(0, b) for b in args.budgets]:
        passes = micro_batches(lengths, 0, args.rows, max_rows=micro, max_tokens=budget)
        largest = max(len(p) * int(lengths[p].max()) for p in passes)  # padded tokens: rows x the longest
        label = f"{budget} tokens" if budget else (f"{micro} row{'s' * (micro > 1)}" if micro else "all")
        head = f"| {label} | {len(passes)} | {largest * args.vocab * 4 / 2**20:.2f} |"
        m = run_child(micro, budget, args)
        if isinstance(m, str):
            print(f"{head} {m} | | | | | | |")
            continue
        print(f"{head} {m['rss_peak_gib']:.1f} | {m['rss_before_gib']:.1f} | {m['seconds']:.1f} | "
              f"{m['tokens'] / m['seconds']:.0f} | {m['actor/grad_norm']:.6f} | {m['critic/grad_norm']:.6f} | "
              f"{m['critic/value_loss']:.6f} |", flush=True)
    return 0


if __name__ == "__main__":
    from entry import run_main

    run_main(main, __file__)
