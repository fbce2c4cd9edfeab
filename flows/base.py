"""Stage base: the base policy that RL starts from.

tiny: train the byte-level BPE tokenizer on env text, build the small Qwen2, warm-start it by supervised training
(`base.mode` warm: random valid actions; sft: solver demonstrations), save it to models/base/.
hf: check that `model.path` loads as a causal LM whose chat template (or `model.chat_template`) can play an
episode, and record the path (and that template) in models/base/, with the size, mtime and sha256 of each file
that loading reads: later stages refuse the checkpoint once those change (`ragen.policy.fingerprint`).
Then measure the base policy on each env's val split at the rollout temperature: format-valid rate, success
rate, and the success of random valid actions on the same instances (metrics/base.json and MLflow).

Run: `python -m flows.base [key=value ...]`.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import torch
from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from flows.common import read_seeds, run_stage, write_json
from ragen.config import Config, load_config
from ragen.envs import make_env
from ragen.kernels import pin_threads
from ragen.policy import Policy
from ragen.policy.fingerprint import digest, fingerprint
from ragen.model_meta import save_meta
from ragen.policy.model import build_tiny_model, count_parameters, load_causal_lm, read_chat_template, save_model
from ragen.policy.tokenizer import env_corpus, train_tokenizer
from ragen.records import EpisodeSpec, Trajectory
from ragen.rollout import policy_responder, run_episodes, summarize
from ragen.tracking import MlflowTracker
from ragen.warmstart import scripted_responder, scripted_settings, train_supervised

LOG_EVERY = 10


def warm_data(cfg: Config, policy: Policy, envs_dir: Path) -> list[Trajectory]:
    """The base's supervised conversations: `base.mode`'s script (warm: random valid actions; sft: the solver) on
    each env's train instances."""
    renderer, play = policy.renderer(cfg.rollout.enable_think), scripted_settings(cfg.rollout)
    respond = scripted_responder(cfg.base.mode, policy.tokenizer, renderer.prefix, seed=cfg.base.seed,
                                 max_actions_per_turn=cfg.rollout.max_actions_per_turn,
                                 max_turns=cfg.rollout.max_turns, enable_think=cfg.rollout.enable_think)
    data: list[Trajectory] = []
    for tag in cfg.base.envs or cfg.envs.tags:
        seeds = read_seeds(envs_dir, tag, "train")
        # as many responses per env: single-turn envs (Bandit, Countdown) get max_turns x more conversations
        count = cfg.base.episodes_per_env * cfg.rollout.max_turns // make_env(tag).turn_limit(cfg.rollout.max_turns)
        specs = [EpisodeSpec(tag, seeds[i % len(seeds)], i) for i in range(count)]
        data += run_episodes(specs, respond, renderer, play, max_positions=policy.max_positions)
    return data


@task(cache_policy=NO_CACHE)
def build_tiny(cfg: Config, envs_dir: Path, tracker: MlflowTracker) -> Policy:
    """Tokenizer, model, warm-start data and supervised training for the embedded default."""
    start = time.perf_counter()
    tokenizer = train_tokenizer(env_corpus(cfg.envs.tags, cfg.base.tokenizer_episodes, cfg.base.seed),
                                cfg.model.vocab_size, grid_tokens=cfg.model.grid_tokens)
    m = cfg.model
    model = build_tiny_model(tokenizer, **m.tiny_shape(), seed=m.seed)
    policy = Policy(model, tokenizer)
    data = warm_data(cfg, policy, envs_dir)
    tracker.log_metrics({"base/parameters": count_parameters(model), "base/vocab_size": len(tokenizer),
                         "base/sft_sequences": len(data),
                         "base/sft_tokens_mean": sum(len(t.token_ids) for t in data) / len(data),
                         "timing/base/data_s": time.perf_counter() - start})
    print(f"base | {count_parameters(model) / 1e6:.2f} M parameters, vocab {len(tokenizer)}, "
          f"{len(data)} {cfg.base.mode} conversations")

    pending: list[tuple[int, dict[str, float]]] = []
    train_start = time.perf_counter()

    def log(step: int, metrics: dict[str, float]) -> None:
        pending.append((step, metrics))
        if (step + 1) % LOG_EVERY == 0 or step + 1 == cfg.base.steps:
            for s, values in pending:
                tracker.log_metrics(values, step=s)
            pending.clear()
            elapsed = time.perf_counter() - train_start
            eta = elapsed / (step + 1) * (cfg.base.steps - step - 1)
            print(f"base | step {step + 1}/{cfg.base.steps} | sft/loss {metrics['sft/loss']:.3f} | eta {eta:.0f}s")

    torch.manual_seed(cfg.base.seed)
    train_supervised(model, data, pad_id=tokenizer.pad_token_id, steps=cfg.base.steps,
                     batch_tokens=cfg.base.batch_tokens, lr=cfg.base.lr, warmup_steps=cfg.base.warmup_steps,
                     weight_decay=cfg.base.weight_decay, seed=cfg.base.seed, loss_mask=cfg.base.loss_mask, log=log)
    tracker.log_metrics({"timing/base/train_s": time.perf_counter() - train_start})
    return policy


@task(cache_policy=NO_CACHE)
def evaluate_base(cfg: Config, policy: Policy, envs_dir: Path) -> tuple[dict[str, dict[str, float]], list[dict]]:
    """Base policy vs random valid actions on the first `base.eval_episodes` val instances of each env."""
    renderer = policy.renderer(cfg.rollout.enable_think)
    generator = torch.Generator(policy.model.device).manual_seed(cfg.base.seed)
    results, samples = {}, []
    for tag in cfg.envs.tags:
        seeds = read_seeds(envs_dir, tag, "val")[: cfg.base.eval_episodes]
        specs = [EpisodeSpec(tag, seed, i) for i, seed in enumerate(seeds)]
        trajectories = run_episodes(specs, policy_responder(policy, cfg.rollout, generator=generator), renderer,
                                    cfg.rollout, max_positions=policy.max_positions)
        randoms = run_episodes(specs, scripted_responder("warm", policy.tokenizer, renderer.prefix, seed=cfg.base.seed,
                                                         max_actions_per_turn=cfg.rollout.max_actions_per_turn,
                                                         max_turns=cfg.rollout.max_turns,
                                                         enable_think=cfg.rollout.enable_think),
                               renderer, scripted_settings(cfg.rollout), max_positions=policy.max_positions)
        results[tag] = {**summarize(trajectories), "random_success_rate": summarize(randoms)["success_rate"]}
        samples += [{"tag": tag, "seed": t.seed, "success": t.success, "return": t.traj_return,
                     "transcript": policy.tokenizer.decode(t.token_ids[t.system_len:])} for t in trajectories[:2]]
        r = results[tag]
        print(f"base | {tag:<13} | format-valid {r['format_valid_rate']:.3f} | success {r['success_rate']:.3f} "
              f"(random actions {r['random_success_rate']:.3f})")
    return results, samples


@flow(name="base")
def base(params: str = "params.yaml", overrides: list[str] | None = None, envs_dir: str = "data/envs",
         out_dir: str = "models/base", metrics_path: str = "metrics/base.json") -> dict[str, dict[str, float]]:
    cfg = load_config(params, overrides or [])
    pin_threads(cfg.model.threads)  # before any torch work: the same sums on every machine
    random.seed(cfg.base.seed)
    envs_path = Path(envs_dir)
    for tag in cfg.envs.tags:  # fail before any training when envgen has not run
        read_seeds(envs_path, tag, "val")
    with MlflowTracker.for_stage(cfg, "base", tags={"ragen.env_tags": ",".join(cfg.envs.tags),
                                                    "ragen.base_mode": cfg.base.mode,
                                                    "ragen.base_loss_mask": cfg.base.loss_mask}) as tracker:
        if cfg.model.source == "tiny":
            policy = build_tiny(cfg, envs_path, tracker)
            meta = {"source": "tiny", "mode": cfg.base.mode}
        else:
            template = read_chat_template(cfg.model.chat_template) if cfg.model.chat_template else ""
            model, tokenizer = load_causal_lm(cfg.model.path, chat_template=template, **cfg.model.placement())
            policy = Policy(model.eval(), tokenizer)
            meta = {"source": "hf", "path": str(Path(cfg.model.path).expanduser().resolve())}
            if template:  # later stages load the checkpoint with it: the file may change, this copy does not
                meta["chat_template"] = template
            print(f"base | hf model {meta['path']}: {count_parameters(model) / 1e6:.1f} M parameters on {model.device}")
            start = time.perf_counter()
            meta["files"] = fingerprint(meta["path"])  # later stages refuse the checkpoint if these change
            tracker.set_tags({"ragen.checkpoint_sha256": digest(meta["files"])})
            size = sum(entry["bytes"] for entry in meta["files"].values())
            print(f"base | recorded {len(meta['files'])} files of the checkpoint ({size / 1e6:.1f} MB hashed in "
                  f"{time.perf_counter() - start:.1f} s)")
        start = time.perf_counter()
        results, samples = evaluate_base(cfg, policy, envs_path)
        tracker.log_metrics({f"base/{tag}/{k}": v for tag, r in results.items() for k, v in r.items()}
                            | {"timing/base/eval_s": time.perf_counter() - start})
        tracker.log_dict({"episodes": samples}, "samples/base_val_episodes.json")
        if cfg.model.source == "tiny":
            save_model(policy.model, out_dir, tokenizer=policy.tokenizer, meta=meta)
        else:
            save_meta(out_dir, meta)
        write_json(metrics_path, results)
    return results


if __name__ == "__main__":
    run_stage(base)
