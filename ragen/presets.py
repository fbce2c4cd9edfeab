"""The paper's algorithm presets as `key=value` overrides (RAGEN train_all.sh; ragen-reference section 1.8).

- starpo_s: PPO with the critic, keep the top 25% groups by reward std, clip-higher (0.2 / 0.28), no KL.
- starpo_ppo: vanilla StarPO with PPO: no filtering, symmetric clip 0.2, KL in the reward (k1, 0.001).
- starpo_grpo: vanilla StarPO with GRPO: group-normalised returns, no critic, no filtering, clip 0.2,
  KL as a loss (k1, 0.001).
- rft (not RAGEN's; a baseline beside it): rejection-sampling fine-tuning online, as in RAFT / ReST-EM / expert
  iteration: keep only each group's best successful rollout (highest return, then fewest actions) and train on it
  with advantage 1 through the same clipped loss; no critic, no KL.
- grpo_best (not RAGEN's): GRPO on a binary outcome, 1 for each group's best success and 0 for every other
  rollout, so the best success is pushed up and the rest of its group down (groups without a success, whose
  scores are all 0, are dropped); clip 0.2 / 0.28, no KL.
None has a first-action bonus (algo.first_action_bonus=none), so a run that adds one is tagged custom.
Use one with `preset=NAME` wherever overrides are accepted (`python -m flows.update preset=starpo_grpo`), or
pass its keys to `dvc exp run -S`. Later overrides win, so every knob can still be set on its own.
"""

PRESETS: dict[str, list[str]] = {
    "starpo_s": ["algo.advantage=gae", "algo.reward_norm=identity", "filter.keep_ratio=0.25",
                 "algo.clip_eps_low=0.2", "algo.clip_eps_high=0.28", "algo.kl=none", "algo.kl_coef=0.0",
                 "algo.first_action_bonus=none"],
    "starpo_ppo": ["algo.advantage=gae", "algo.reward_norm=identity", "filter.keep_ratio=1.0",
                   "algo.clip_eps_low=0.2", "algo.clip_eps_high=0.2", "algo.kl=reward_k1", "algo.kl_coef=0.001",
                   "algo.first_action_bonus=none"],
    "starpo_grpo": ["algo.advantage=grpo", "algo.grpo_by_std=True", "algo.reward_norm=mean_std",
                    "filter.keep_ratio=1.0", "algo.clip_eps_low=0.2", "algo.clip_eps_high=0.2", "algo.kl=loss_k1",
                    "algo.kl_coef=0.001", "algo.first_action_bonus=none"],
    "rft": ["algo.advantage=rft", "filter.within=best_success", "filter.keep_ratio=1.0", "filter.mode=std",
            "algo.clip_eps_low=0.2", "algo.clip_eps_high=0.28", "algo.kl=none", "algo.kl_coef=0.0",
            "algo.first_action_bonus=none"],
    "grpo_best": ["algo.advantage=grpo", "algo.grpo_by_std=True", "algo.outcome=best_success",
                  "algo.reward_norm=mean_std", "filter.keep_ratio=1.0", "filter.mode=nonzero", "filter.within=all",
                  "algo.clip_eps_low=0.2", "algo.clip_eps_high=0.28", "algo.kl=none", "algo.kl_coef=0.0",
                  "algo.first_action_bonus=none"],
}


def expand_presets(overrides: list[str]) -> list[str]:
    """Replace each `preset=NAME` with the preset's overrides, in place (so later overrides still win)."""
    out = []
    for item in overrides:
        if item.startswith("preset="):
            name = item.split("=", 1)[1]
            if name not in PRESETS:
                raise KeyError(f"unknown preset {name!r}; known presets: {', '.join(PRESETS)}")
            out += PRESETS[name]
        else:
            out.append(item)
    return out
