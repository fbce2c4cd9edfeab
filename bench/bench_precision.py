"""Whether the weights move: AdamW steps at RAGEN's learning rates under each `model.dtype`.

    python bench/bench_precision.py [--layers 2] [--steps 5] [--lrs 1e-6 1e-5 1e-4]

A random Qwen2 of bench_cuda's shape (Qwen2.5-0.5B-Instruct's by default, `--layers` of its 24 layers, over our
1,024-token tokenizer) is saved as a local checkpoint as bench_cuda saves it and loaded through the hf path
(`ragen.policy.load_policy`) with each `model.dtype`: float32, bf16-mixed (float32 weights, bfloat16 compute; what
`auto` picks on CUDA since 2026-12-06) and bfloat16 (weights stored in bfloat16; what `auto` picked on CUDA before).
For each learning rate (RAGEN's actor 1e-6 and critic 1e-5, and the tiny policy's 1e-4) it runs `--steps` AdamW steps
(weight decay 0.01) on the log-likelihood of the same 8 sampled Sokoban turns, scored as the update scores them
(`token_logprobs`), and prints the share of the weights float32's steps move that moved, and the mean size of their
change against float32's. A weight stored in bfloat16 has 8 significant bits: a step smaller than half its spacing
(2^-9 to 2^-8 of the weight) rounds away, so at lr 1e-6 nearly nothing moves. The CPU runs bfloat16 compute under
autocast as a GPU does.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from bench_cuda import SHAPES, build_checkpoint  # same folder
from ragen.policy import load_policy
from ragen.policy.sampling import left_pad
from ragen.policy.scoring import token_logprobs

DTYPES = ["float32", "bf16-mixed", "bfloat16"]


def episodes(checkpoint: Path, rows: int = 8, new_tokens: int = 24) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`rows` first turns of Sokoban sampled by the float32 model: (ids, attention mask, mask of the responses)."""
    policy = load_policy(checkpoint, device="cpu", dtype="float32")
    _, prompt, _ = policy.renderer(True).start("Turn 1:\nState:\n######\n#_P__#\n#_X__#\n#__O_#\n######\n")
    samples = policy.sample([prompt] * rows, max_new_tokens=new_tokens, generator=torch.Generator().manual_seed(0))
    ids, mask = left_pad([prompt + list(s.token_ids) for s in samples], policy.tokenizer.pad_token_id,
                         torch.device("cpu"))
    responses = torch.zeros_like(mask)
    for row, sample in enumerate(samples):
        responses[row, ids.shape[1] - len(sample.token_ids):] = 1  # left padded: each response ends its row
    return ids, mask, responses


def steps(checkpoint: Path, dtype: str, lr: float, n: int, batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
          ) -> tuple[list[torch.Tensor], list[torch.Tensor], float]:
    """Weights before and after `n` AdamW steps of the responses' log-likelihood, and seconds a step."""
    ids, mask, trained = batch
    policy = load_policy(checkpoint, device="cpu", dtype=dtype)
    params = list(policy.model.parameters())
    before = [p.detach().float().clone() for p in params]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.01)
    start = time.perf_counter()
    for _ in range(n):
        optimizer.zero_grad(set_to_none=True)
        logprobs, _ = token_logprobs(policy.model, ids, mask)
        (-(logprobs * trained).sum() / trained.sum()).backward()
        optimizer.step()
    seconds = (time.perf_counter() - start) / n
    return before, [p.detach().float() for p in params], seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=2, help="of Qwen2.5-0.5B's 24")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--lrs", type=float, nargs="+", default=[1e-6, 1e-5, 1e-4])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-0.5b", help="bench_cuda's shapes")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = build_checkpoint(Path(tmp), args.shape, num_hidden_layers=args.layers)  # its base folder
        batch = episodes(checkpoint)
        print(f"# {args.steps} AdamW steps (weight decay 0.01) on {batch[0].shape[0]} sampled Sokoban turns, random "
              f"Qwen2 of shape {args.shape} at {args.layers} layers, on {torch.get_num_threads()} CPU "
              f"threads (torch {torch.__version__})")
        print("| lr | model.dtype | share of float32's moved weights that moved | mean change / float32's | s a step |")
        print("|---|---|---|---|---|")
        for lr in args.lrs:
            reference = None
            for dtype in DTYPES:
                before, after, seconds = steps(checkpoint, dtype, lr, args.steps, batch)
                deltas = [(a - b).abs() for a, b in zip(after, before)]
                if reference is None:
                    reference = deltas  # float32's
                live = [d_ref > 0 for d_ref in reference]  # weights float32's steps moved
                moved = sum(int(((d > 0) & m).sum()) for d, m in zip(deltas, live)) / sum(int(m.sum()) for m in live)
                ratio = (sum(float(d[m].sum()) for d, m in zip(deltas, live))
                         / sum(float(r[m].sum()) for r, m in zip(reference, live)))
                print(f"| {lr:g} | {dtype} | {moved:.1%} | {ratio:.3f} | {seconds:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    from entry import run_main

    run_main(main, __file__)
