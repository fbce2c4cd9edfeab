"""Stage critic_fit: warm the critic up on the filtered base rollouts' returns -> models/critic_warm/.

The critic starts as a copy of the base policy with a zero value head, then regresses V_t onto the return of its
trajectory (gamma = lam = 1: every token's target is R) for `critic.warmup_epochs` passes. With GRPO
(algo.advantage grpo) there is no critic and the stage records that.

Run: `python -m flows.critic_fit [key=value ...]`.
"""

from __future__ import annotations

import torch
from prefect import flow

from flows.common import run_stage, write_json
from ragen.batching import build_batch
from ragen.config import load_config
from ragen.losses import explained_variance
from ragen.policy import load_policy
from ragen.policy.model import build_critic, save_meta, save_model
from ragen.policy.scoring import token_values
from ragen.tracking import MlflowTracker
from ragen.trajectory_io import read_trajectories


@flow(name="critic_fit")
def critic_fit(params: str = "params.yaml", overrides: list[str] | None = None, base_dir: str = "models/base",
               rollouts: str = "data/rollouts/filtered.parquet", out_dir: str = "models/critic_warm",
               metrics_path: str = "metrics/critic_fit.json") -> dict[str, float]:
    cfg = load_config(params, overrides or [])
    trajectories = read_trajectories(rollouts)
    with MlflowTracker.for_stage(cfg, "critic_fit") as tracker:
        if cfg.algo.advantage != "gae":
            save_meta(out_dir, {"critic": "none", "advantage": cfg.algo.advantage})
            write_json(metrics_path, {})
            return {}
        policy = load_policy(base_dir, **cfg.model.placement())
        torch.manual_seed(cfg.train.seed)
        critic = build_critic(policy.model)
        optimizer = torch.optim.AdamW(critic.parameters(), lr=cfg.critic.lr, weight_decay=cfg.train.weight_decay)
        batch = build_batch(trajectories, pad_id=policy.tokenizer.pad_token_id, device=policy.model.device,
                            loss_mask=cfg.algo.loss_mask)
        targets = batch.traj_returns[:, None].expand_as(batch.token_rewards)  # (B, T): R on every token
        mask, size = batch.loss_mask, cfg.train.mini_batch_size
        critic.train()
        for epoch in range(cfg.critic.warmup_epochs):
            losses = []
            for start in range(0, batch.input_ids.shape[0], size):
                rows = slice(start, start + size)
                values = token_values(critic, batch.input_ids[rows], batch.attention_mask[rows])
                m = mask[rows].float()
                loss = 0.5 * (((values - targets[rows]) ** 2) * m).sum() / m.sum().clamp(min=1)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(critic.parameters(), cfg.train.grad_clip)
                optimizer.step()
                losses.append(loss.item())
            tracker.log_metrics({"critic_fit/value_loss": sum(losses) / len(losses)}, step=epoch)
        critic.eval()
        with torch.no_grad():
            values = token_values(critic, batch.input_ids, batch.attention_mask)
        metrics = {"critic_fit/value_loss": sum(losses) / len(losses),
                   "critic_fit/explained_var": explained_variance(values, targets, mask)}
        save_model(critic, out_dir, meta={"critic": "warm", "trajectories": len(trajectories)})
        tracker.log_metrics(metrics)
        write_json(metrics_path, metrics)
        print(f"critic_fit | {len(trajectories)} trajectories x {cfg.critic.warmup_epochs} epochs | value loss "
              f"{metrics['critic_fit/value_loss']:.4f} | explained var {metrics['critic_fit/explained_var']:.3f}")
    return metrics


if __name__ == "__main__":
    run_stage(critic_fit)
