"""Reproducibility fingerprint: which layer of the stack makes two machines disagree.

    python bench/bench_fingerprint.py [--model models/base] > fingerprint-$(hostname).txt
    diff fingerprint-a.txt fingerprint-b.txt

On one machine the same params and seed give the same metrics; across machines they can differ. This prints one
short hash per layer, bottom up, so that a diff of two machines' outputs names the lowest layer that differs:

    machine    torch version, ATen's CPU capability, threads (params.yaml's `model.threads`, as the stages compute,
               or --threads), the CPU (informative; expected to differ)
    rng        torch's CPU generators: uniform (mt19937), exponential_ (what torch.multinomial draws with),
               multinomial itself
    kernels    a matmul, a softmax, the policy's logits over a whole sequence and one token at a time (KV cache)
    sampling   32 bandit and 16 sokoban episodes of `--model` at temperature 1 from generator seed 0, the rollout's
               own path; one 4-hex hash per episode, so one diverged episode can be told from a cascade
    training   three AdamW steps of `--model` on those episodes' sampled tokens, then a hash of the weights
    pipeline   the md5 of each DVC output present (every file of models/base and models/policy, the rollouts,
               the metrics); absent ones are skipped

Each hash covers exact bytes, so a last-bit float difference shows. If `kernels` differ but the sampled tokens match,
the float differences are too small to flip a draw; if `rng` and `kernels` match but the tokens differ, the cause is
above them. Not a test: it prints, it does not judge.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import platform
from pathlib import Path

import torch

from ragen.batching import build_batch
from ragen.config import RolloutConfig, load_config
from ragen.kernels import pin_threads
from ragen.policy import Policy, load_policy
from ragen.policy.scoring import token_logprobs
from ragen.records import EpisodeSpec, Trajectory
from ragen.rollout import policy_responder, run_episodes

PIPELINE_DIRS = ("models/base", "models/policy")  # every file: DVC's directory hash changes with any one of them
PIPELINE_FILES = ("data/rollouts/base.parquet", "data/rollouts/filtered.parquet", "metrics/base.json",
                  "metrics/eval.json")


def digest(data: bytes | torch.Tensor, chars: int = 12) -> str:
    if isinstance(data, torch.Tensor):
        data = data.detach().contiguous().cpu().numpy().tobytes()
    return hashlib.md5(data).hexdigest()[:chars]


def cpu_name() -> str:
    info = Path("/proc/cpuinfo")
    lines = info.read_text().splitlines() if info.exists() else []
    names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    return names[0] if names else platform.processor()


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def rng_layer() -> dict[str, str]:
    probs = torch.rand(64, 300, generator=gen(0)).pow(4)  # (64, 300), peaked like a policy's next-token probs
    draws = torch.cat([torch.multinomial(probs, 1, generator=gen(1)) for _ in range(4)], 1)  # (64, 4)
    return {"uniform": digest(torch.rand(1 << 16, generator=gen(2))),
            "exponential": digest(torch.empty(1 << 16).exponential_(1, generator=gen(3))),
            "multinomial": digest(draws)}


@torch.no_grad()
def kernel_layer(policy: Policy, sequence: list[int]) -> dict[str, str]:
    a, b = torch.randn(256, 512, generator=gen(4)), torch.randn(512, 300, generator=gen(5))
    ids = torch.tensor([sequence])  # (1, T)
    full = policy.model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False).logits  # (1, T, V)
    out, stepped = None, []
    for t in range(ids.shape[1]):  # one token at a time on top of the cache: the sampler's decode shapes
        out = policy.model(input_ids=ids[:, t : t + 1], past_key_values=out.past_key_values if out else None,
                           use_cache=True)
        stepped.append(out.logits[:, -1])
    product = a @ b  # (256, 300)
    return {"matmul": digest(product), "softmax": digest(product.softmax(-1)), "logits_full": digest(full),
            "logits_cached": digest(torch.stack(stepped, 1))}


def play(policy: Policy, bandit: int, sokoban: int) -> list[Trajectory]:
    """`bandit` Bandit episodes in groups of 8 and `sokoban` Sokoban ones in groups of 4, as a rollout plays them."""
    cfg = RolloutConfig()
    specs = [EpisodeSpec("bandit", 7_000 + i // 8, i // 8) for i in range(bandit)]
    specs += [EpisodeSpec("sokoban", 8_000 + i // 4, 1_000 + i // 4) for i in range(sokoban)]
    respond = policy_responder(policy, cfg, generator=gen(0))
    return run_episodes(specs, respond, policy.renderer(cfg.enable_think), cfg,
                        max_positions=policy.max_positions)


def sampling_layer(trajectories: list[Trajectory]) -> dict[str, str]:
    sampled = [t for traj in trajectories for turn in traj.turns for t in turn.response_ids]
    logprobs = torch.tensor([lp for traj in trajectories for turn in traj.turns for lp in turn.response_logprobs])
    return {"tokens": f"{digest(repr(sampled).encode())} ({len(sampled)} sampled)",
            "logprobs": digest(logprobs),
            "successes": f"{sum(t.success for t in trajectories)}/{len(trajectories)}",
            "per_episode": " ".join(digest(repr(t.token_ids).encode(), 4) for t in trajectories)}


def training_layer(policy: Policy, trajectories: list[Trajectory], steps: int = 3) -> dict[str, str]:
    """Trains a copy of the policy's model: the caller's weights stay as they were."""
    rows = build_batch(trajectories, pad_id=policy.tokenizer.pad_token_id, device=torch.device("cpu"))  # left padded
    model = copy.deepcopy(policy.model).train()
    torch.manual_seed(0)  # dropout, if the model has any
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    losses = []
    for _ in range(steps):
        logprobs, _ = token_logprobs(model, rows.input_ids, rows.attention_mask)  # (B, T)
        loss = -(logprobs * rows.loss_mask).sum() / rows.loss_mask.sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    return {"losses": digest(torch.tensor(losses, dtype=torch.float64)), "weights": digest(weights)}


def fingerprint(policy: Policy, *, bandit: int = 32, sokoban: int = 16) -> dict[str, dict[str, str]]:
    """The rng, kernels, sampling and training layers for this policy (see the module docstring)."""
    trajectories = play(policy, bandit, sokoban)
    return {"rng": rng_layer(), "kernels": kernel_layer(policy, list(trajectories[-1].token_ids[:64])),
            "sampling": sampling_layer(trajectories), "training": training_layer(policy, trajectories)}


def pipeline_layer() -> dict[str, str]:
    paths = [str(p) for d in PIPELINE_DIRS if Path(d).is_dir() for p in sorted(Path(d).iterdir()) if p.is_file()]
    paths += [p for p in PIPELINE_FILES if Path(p).exists()]
    return {path: hashlib.md5(Path(path).read_bytes()).hexdigest() for path in paths}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="models/base", help="a policy directory (default: the pipeline's base)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch's CPU threads (default: params.yaml's model.threads, the count the stages use)")
    args = parser.parse_args()
    params = "params.yaml" if Path("params.yaml").exists() else None  # --threads checked as model.threads is
    pin_threads(load_config(params, [] if args.threads is None else [f"model.threads={args.threads}"]).model.threads)
    if not Path(args.model, "config.json").exists():
        raise SystemExit(f"{args.model} holds no policy (config.json missing); run `dvc repro base` or pass --model")
    policy = load_policy(args.model, device="cpu", dtype="float32")
    policy.model.eval()
    layers = {"machine": {"torch": torch.__version__, "capability": torch.backends.cpu.get_cpu_capability(),
                          "threads": str(torch.get_num_threads()), "cpu": cpu_name()},
              **fingerprint(policy), "pipeline": pipeline_layer()}
    print(f"# reproducibility fingerprint | model {args.model} | diff two machines' outputs; the lowest differing "
          "layer is the first suspect")
    for layer, values in layers.items():
        for name, value in values.items():
            print(f"{layer:<9} {name:<40} {value}")


if __name__ == "__main__":
    from entry import run_main

    run_main(main, __file__)
