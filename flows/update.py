"""Stage update: the online StarPO(-S) loop for `train.steps` steps (RAGEN section 1.1).

Step 1 updates on the filtered base rollouts (stage filter); every later step rolls out, filters and updates in
process (ragen.train.train_step). Validation success at the eval temperature every `train.eval_every` steps and
before training. Every step logs RAGEN's metric families to MLflow; a checkpoint every `train.checkpoint_every`
steps lets a killed run resume and end exactly where an uninterrupted one would (the same params, input files and
code only, the micro-batch limits aside: `run_digest`).

Writes models/policy/, models/critic/, metrics/train.json and metrics/train_steps.csv (for `dvc plots`).
Run: `python -m flows.update [key=value ...]`.
"""

from __future__ import annotations

import csv
import shutil
import time
from pathlib import Path

import torch
from prefect import flow

from flows.common import (check_stop, read_seeds, read_train_pool, run_stage, source_digest, tree_digest,
                          write_json)
from flows.lineage import check_input, made_with
from flows.memory import memory_limits_aside
from ragen.checkpoint import load_checkpoint, read_checkpoint_meta, save_checkpoint
from ragen.config import Config, config_digest, load_config
from ragen.evaluation import evaluate_policy
from ragen.fileio import staged_file
from ragen.kernels import pin_threads
from ragen.policy import load_policy
from ragen.model_meta import read_meta, save_meta
from ragen.policy.model import load_critic, save_model
from ragen.report import OTHER_VAL
from ragen.tracking import MlflowTracker
from ragen.train import Learner, train_step
from ragen.trajectory_io import read_scores, read_settings, read_trajectories, sample_table
from ragen.update import uses_critic

# step curves also logged on the parent pipeline run, so pipeline runs (ablation variants) chart side by side
PIPELINE_CURVES = {"rollout/success_rate", "rollout/return_mean", "rollout/in_group_std_mean", "actor/entropy",
                   "actor/grad_norm", "rollout/first_action_entropy", "rollout/first_action_mi",
                   "rollout/response_distinct_in_group"}
PLOT_KEYS = ["step", "val_success", "rollout/success_rate", "rollout/return_mean", "rollout/in_group_std_mean",
             "filter/kept_frac", "actor/entropy", "actor/grad_norm", "actor/pg_loss", "critic/value_loss",
             "rollout/first_action_entropy", "rollout/first_action_mi", "rollout/first_action_top_share",
             "rollout/response_distinct_in_group", "rollout/pass_at_n"]


def make_learner(cfg: Config, base_dir: str, critic_dir: str) -> Learner:
    policy = load_policy(base_dir, **cfg.model.placement())
    critic = None
    if uses_critic(cfg.algo.advantage):
        if read_meta(critic_dir).get("critic") != "warm":
            raise FileNotFoundError(f"{critic_dir} holds no warmed critic; run stage critic_fit with the same "
                                    f"algo.advantage ({cfg.algo.advantage})")
        critic = load_critic(critic_dir, **cfg.model.placement())
    ref = load_policy(base_dir, **cfg.model.placement()).model if cfg.algo.kl != "none" else None
    actor_opt = torch.optim.AdamW(policy.model.parameters(), lr=cfg.train.lr, weight_decay=cfg.train.weight_decay)
    critic_opt = (torch.optim.AdamW(critic.parameters(), lr=cfg.critic.lr, weight_decay=cfg.train.weight_decay)
                  if critic is not None else None)
    return Learner(policy, critic, ref, actor_opt, critic_opt)


def run_digest(cfg: Config, envs_dir: str, base_dir: str, critic_dir: str, rollouts: str,
               base_rollouts: str | None) -> str:
    """What a checkpoint must have been made from to be resumed: the config (tracking aside), the files the stage
    reads (the train env's tables, the base policy, the warmed critic, the stage-filter batch and the batch it was
    filtered from) and the source code. A run resumed on other inputs or code would end nowhere an uninterrupted
    run ends: say the base was trained again, or the code pulled anew, after the kill.

    `train.micro_batch_size` and `train.micro_batch_tokens` do not count: they change the memory a step holds and
    nothing else (its passes' gradients add up to the one-pass gradient, to float rounding), so a run that ran out
    of memory resumes from its checkpoint in smaller passes."""
    cfg = memory_limits_aside(cfg)
    inputs = [tree_digest(path) for path in (Path(envs_dir) / cfg.train.env, base_dir, critic_dir, rollouts)]
    inputs.append(tree_digest(base_rollouts) if base_rollouts is not None else "")
    return config_digest(cfg, inputs, source_digest())[:16]


def checkpoint_parts(learner: Learner) -> tuple[dict, dict]:
    models = {"policy": learner.policy.model} | ({"critic": learner.critic} if learner.critic is not None else {})
    optimizers = {"actor": learner.actor_opt} | ({"critic": learner.critic_opt} if learner.critic_opt else {})
    return models, optimizers


@flow(name="update")
def update_policy(params: str = "params.yaml", overrides: list[str] | None = None, envs_dir: str = "data/envs",
                  base_dir: str = "models/base", critic_dir: str = "models/critic_warm",
                  rollouts: str = "data/rollouts/filtered.parquet",
                  base_rollouts: str | None = "data/rollouts/base.parquet", policy_dir: str = "models/policy",
                  critic_out: str = "models/critic", metrics_path: str = "metrics/train.json",
                  steps_csv: str = "metrics/train_steps.csv", checkpoint_dir: str = "checkpoints/update",
                  stop_after: int | None = None) -> dict[str, float]:
    """`stop_after` ends the run after that many steps as if killed (for resume tests). Step 1 trains on the
    filtered batch `rollouts`; its rollout/ metrics are those of the whole batch it was filtered from,
    `base_rollouts` (None: of the filtered batch)."""
    cfg = load_config(params, overrides or [])
    pin_threads(cfg.model.threads)  # before any torch work: the same sums on every machine
    pool = read_train_pool(envs_dir, cfg.train.env, cfg.train.max_optimal_moves)
    val_seeds = {tag: read_seeds(envs_dir, tag, "val")[: cfg.train.eval_episodes] for tag in cfg.train.val_tags()}
    first_batch, first_scores = read_trajectories(rollouts), read_scores(rollouts)
    first_rollout = read_trajectories(base_rollouts) if base_rollouts is not None else None
    made = read_settings(rollouts)
    check_input(rollouts, made, cfg, "update", overrides)
    if base_rollouts is not None:
        check_input(base_rollouts, read_settings(base_rollouts), cfg, "update", overrides)
    if uses_critic(cfg.algo.advantage):
        warmed = read_meta(critic_dir).get("settings")
        check_input(critic_dir, warmed, cfg, "update", overrides)
        made = {**(made or {}), **(warmed or {})}
    learner = make_learner(cfg, base_dir, critic_dir)
    digest, history, start_step = run_digest(cfg, envs_dir, base_dir, critic_dir, rollouts, base_rollouts), [], 0
    ckpt = Path(checkpoint_dir)
    models, optimizers = checkpoint_parts(learner)
    saved = read_checkpoint_meta(ckpt)
    if saved is not None and saved.get("digest") == digest:
        meta = load_checkpoint(ckpt, models=models, optimizers=optimizers)
        start_step, history = meta["step"], meta["history"]
        print(f"update | resuming from the checkpoint after step {start_step}")
    elif saved is not None:  # another run was killed here; its checkpoint is replaced at the first save
        print(f"update | {ckpt} holds a checkpoint of other params, inputs or code (run digest {saved.get('digest')}, "
              f"not {digest}); starting from step 0")
    with MlflowTracker.for_stage(cfg, "update") as tracker:
        for row in history:  # a resumed run carries the earlier steps' metrics
            tracker.log_metrics({k: v for k, v in row.items() if k != "step"}, step=int(row["step"]))
        begin = time.perf_counter()
        for step in range(start_step, cfg.train.steps):
            check_stop()  # an interrupted ablation set ends its variants here (flows.common.stopping_threads)
            metrics = {}
            if step % cfg.train.eval_every == 0:
                metrics |= validate(cfg, learner, val_seeds)[0]
            metrics |= train_step(cfg, learner, pool, step, first_batch=first_batch if step == 0 else None,
                                  first_scores=first_scores if step == 0 else None,
                                  first_rollout=first_rollout if step == 0 else None)
            tracker.log_metrics(metrics, step=step)
            tracker.log_to_pipeline({k: v for k, v in metrics.items() if k in PIPELINE_CURVES or k.startswith("val/")},
                                    step=step)
            history.append({"step": step, **metrics})
            elapsed = time.perf_counter() - begin
            eta = elapsed / (step + 1 - start_step) * (cfg.train.steps - step - 1)
            val = metrics.get(f"val/{cfg.train.env}/success")
            entropy = metrics.get("actor/entropy", float("nan"))  # absent when a step skipped its update
            print(f"update | step {step + 1}/{cfg.train.steps} | rollout/success {metrics['rollout/success_rate']:.3f}"
                  f" | filter/kept {metrics['filter/kept_frac']:.2f} | actor/entropy {entropy:.3f}"
                  + (f" | val/success {val:.3f}" if val is not None else "") + f" | eta {eta:.0f}s")
            if (step + 1) % cfg.train.checkpoint_every == 0 and step + 1 < cfg.train.steps:
                save_checkpoint(ckpt, models=models, optimizers=optimizers,
                                meta={"step": step + 1, "digest": digest, "history": history})
            if stop_after is not None and step + 1 - start_step >= stop_after:
                return {}
        final_val, val_trajectories = validate(cfg, learner, val_seeds)
        final = {f"val/{cfg.train.env}/success": final_val[f"val/{cfg.train.env}/success"],
                 "train/steps": cfg.train.steps}
        online = history[1:] or history  # step 0 trains on the stage-filter batch and rolls nothing out
        for key in ("timing/rollout_s", "timing/score_s", "timing/update_s", "perf/rollout_tokens_per_s",
                    "perf/score_tokens_per_s", "perf/update_tokens_per_s"):
            logged = [row[key] for row in online if key in row]  # a checkpoint of older code lacks newer keys
            if logged:
                final[f"{key}_mean"] = sum(logged) / len(logged)
        tracker.log_metrics(final_val, step=cfg.train.steps)
        tracker.log_to_pipeline(final_val, step=cfg.train.steps)
        tracker.log_table(sample_table(val_trajectories), "samples/final_val_trajectories.json")
        save_model(learner.policy.model, policy_dir, tokenizer=learner.policy.tokenizer,
                   meta={"source": "tiny" if read_meta(base_dir).get("source") == "tiny" else "trained",
                         "env": cfg.train.env, "steps": cfg.train.steps, "settings": made_with("update", cfg, made)})
        if learner.critic is not None:
            save_model(learner.critic, critic_out, meta={"critic": "trained"})
        else:
            save_meta(critic_out, {"critic": "none"})
        # the DVC metrics file holds deterministic content only; timings are returned and live in MLflow
        write_json(metrics_path, {k: v for k, v in final.items() if not k.startswith(("timing/", "perf/"))})
        write_steps_csv(steps_csv, history, cfg.train.val_tags(), final_val)
        shutil.rmtree(ckpt, ignore_errors=True)
        print("update | done | " + " | ".join(f"{key} {value:.3f}" for key, value in final_val.items()))
    return final


def validate(cfg: Config, learner: Learner, val_seeds: dict[str, list[int]]) -> tuple[dict[str, float], list]:
    """The policy's success on the val instances of each env in `val_seeds` (train.env first, then
    train.val_envs) at the eval temperature -> {"val/<env>/success": rate}, and train.env's trajectories."""
    metrics, trajectories = {}, []
    for tag, seeds in val_seeds.items():
        summary, played = evaluate_policy(learner.policy, tag, seeds, cfg.rollout, temperature=cfg.eval.temperature,
                                          seed=cfg.train.seed)
        metrics[f"val/{tag}/success"] = summary["success_rate"]
        if tag == cfg.train.env:
            trajectories = played
    return metrics, trajectories


def write_steps_csv(path: str, history: list[dict], envs: list[str], final_val: dict[str, float]) -> None:
    """One row per training step (its val_success the last in-loop evaluation's of `envs[0]`, train.env, carried
    forward; a column `val_success/<env>` (OTHER_VAL) likewise for each other env of `envs`, train.val_envs), then
    a row at step train.steps with the evaluations after the last update alone (`final_val`, by "val/<env>/success"),
    so the val curves end where training did: without it a 10-step run's curve read the base's figure throughout."""
    columns = [f"val/{env}/success" for env in envs]  # history's keys, in the csv's val columns' order
    header = PLOT_KEYS + [OTHER_VAL + env for env in envs[1:]]
    last = {key: "" for key in columns}
    with staged_file(path) as tmp, open(tmp, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        for row in history:
            last = {key: row.get(key, value) for key, value in last.items()}
            writer.writerow([row["step"], last[columns[0]]] + [row.get(k, "") for k in PLOT_KEYS[2:]]
                            + [last[key] for key in columns[1:]])
        writer.writerow([len(history), final_val[columns[0]]] + [""] * (len(PLOT_KEYS) - 2)
                        + [final_val[key] for key in columns[1:]])


if __name__ == "__main__":
    run_stage(update_policy)
