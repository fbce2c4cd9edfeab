"""Stage critic_fit: warm the critic up on the filtered base rollouts' returns -> models/critic_warm/.

The critic starts as a copy of the base policy with a zero value head, then regresses V_t onto Monte Carlo value
targets for `critic.warmup_epochs` passes. The rollouts are batched as update's first step batches them (returns
normalised by algo.reward_norm as stage filter stored them, rewards placed by algo.reward_placement), and the
targets are the advantage estimator's returns with no values (`ragen.advantages.value_targets`): with gae,
gamma = 1 and the return on the last token every token's target is R; with bilevel_gae and per-turn rewards a
token's target is the discounted sum of its own and later turns' rewards. With GRPO (algo.advantage grpo) there is
no critic and the stage records that.

Run: `python -m flows.critic_fit [key=value ...]`.
"""

from __future__ import annotations

import torch
from prefect import flow

from flows.common import run_stage, write_json
from flows.lineage import check_input, made_with
from ragen.advantages import masked_mean
from ragen.config import load_config
from ragen.kernels import pin_threads
from ragen.losses import explained_variance
from ragen.policy import load_policy
from ragen.model_meta import save_meta
from ragen.policy.model import build_critic, save_model
from ragen.policy.scoring import score_values, shareable_prefix
from ragen.tracking import MlflowTracker
from ragen.train import critic_batch, select, warm_critic
from ragen.trajectory_io import read_scores, read_settings, read_trajectories
from ragen.update import batch_passes, uses_critic


@flow(name="critic_fit")
def critic_fit(params: str = "params.yaml", overrides: list[str] | None = None, base_dir: str = "models/base",
               rollouts: str = "data/rollouts/filtered.parquet", out_dir: str = "models/critic_warm",
               metrics_path: str = "metrics/critic_fit.json") -> dict[str, float]:
    cfg = load_config(params, overrides or [])
    pin_threads(cfg.model.threads)  # before any torch work: the same sums on every machine
    trajectories, made = read_trajectories(rollouts), read_settings(rollouts)
    check_input(rollouts, made, cfg, "critic_fit", overrides)
    settings = made_with("critic_fit", cfg, made)
    with MlflowTracker.for_stage(cfg, "critic_fit") as tracker:
        if not uses_critic(cfg.algo.advantage):
            save_meta(out_dir, {"critic": "none", "advantage": cfg.algo.advantage, "settings": settings})
            write_json(metrics_path, {})
            return {}
        policy = load_policy(base_dir, **cfg.model.placement())
        torch.manual_seed(cfg.train.seed)
        critic = build_critic(policy.model)
        kept, scores, _ = select(cfg, trajectories, already_filtered=True, scores=read_scores(rollouts))  # all of them
        batch, targets = critic_batch(cfg, policy, kept, scores)
        losses = warm_critic(cfg, critic, batch, targets)
        for epoch, loss in enumerate(losses):
            tracker.log_metrics({"critic_fit/value_loss": loss}, step=epoch)
        mask = batch.loss_mask
        values = score_values(critic, batch.input_ids, batch.attention_mask,
                              passes=batch_passes(batch, max_rows=cfg.train.micro_batch_size,
                                                  max_tokens=cfg.train.micro_batch_tokens),
                              prefix_len=shareable_prefix(batch.input_ids, batch.attention_mask, mask))
        metrics = {"critic_fit/value_loss": losses[-1] if losses else  # warmup_epochs 0: the zero head's loss
                   0.5 * masked_mean((values - targets) ** 2, mask).item(),
                   "critic_fit/explained_var": explained_variance(values, targets, mask)}
        save_model(critic, out_dir, meta={"critic": "warm", "trajectories": len(trajectories), "settings": settings})
        tracker.log_metrics(metrics)
        write_json(metrics_path, metrics)
        print(f"critic_fit | {len(trajectories)} trajectories x {cfg.critic.warmup_epochs} epochs | value loss "
              f"{metrics['critic_fit/value_loss']:.4f} | explained var {metrics['critic_fit/explained_var']:.3f}")
    return metrics


if __name__ == "__main__":
    run_stage(critic_fit)
