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
A preset names the keys that define it; in its reference config every other key of sections `algo` and `filter`
keeps the schema's default (ragen/config.py). `nearest_preset` compares those two whole sections, so a run that also
changes a knob no preset names (a first-action bonus, gamma, the aggregation) is not tagged with the preset it
started from. Use one with `preset=NAME` wherever overrides are accepted (`python -m flows.update
preset=starpo_grpo`), or pass its keys to `dvc exp run -S`. Later overrides win, so every knob can still be set on
its own.
"""

from __future__ import annotations

from dataclasses import asdict, fields
from functools import lru_cache

from ragen.config import Config, flatten, load_config

PRESETS: dict[str, list[str]] = {
    "starpo_s": ["algo.advantage=gae", "algo.reward_norm=identity", "filter.keep_ratio=0.25",
                 "algo.clip_eps_low=0.2", "algo.clip_eps_high=0.28", "algo.kl=none", "algo.kl_coef=0.0"],
    "starpo_ppo": ["algo.advantage=gae", "algo.reward_norm=identity", "filter.keep_ratio=1.0",
                   "algo.clip_eps_low=0.2", "algo.clip_eps_high=0.2", "algo.kl=reward_k1", "algo.kl_coef=0.001"],
    "starpo_grpo": ["algo.advantage=grpo", "algo.grpo_by_std=True", "algo.reward_norm=mean_std",
                    "filter.keep_ratio=1.0", "algo.clip_eps_low=0.2", "algo.clip_eps_high=0.2", "algo.kl=loss_k1",
                    "algo.kl_coef=0.001"],
    "rft": ["algo.advantage=rft", "filter.within=best_success", "filter.keep_ratio=1.0", "filter.mode=std",
            "algo.clip_eps_low=0.2", "algo.clip_eps_high=0.28", "algo.kl=none", "algo.kl_coef=0.0"],
    "grpo_best": ["algo.advantage=grpo", "algo.grpo_by_std=True", "algo.outcome=best_success",
                  "algo.reward_norm=mean_std", "filter.keep_ratio=1.0", "filter.mode=nonzero", "filter.within=all",
                  "algo.clip_eps_low=0.2", "algo.clip_eps_high=0.28", "algo.kl=none", "algo.kl_coef=0.0"],
}
PRESET_SECTIONS = ("algo", "filter")  # what a preset fixes: the estimator, the loss and the filter


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


def nearest_preset(config: Config) -> tuple[str, list[str]]:
    """The preset closest to `config` and the config's `key=value` where it departs from it.

    A preset's reference is the schema's defaults with its overrides applied; sections `algo` and `filter` are
    compared key by key. Nearest means fewest differing keys, ties to the earlier preset in PRESETS. An empty list
    means the config runs exactly that preset.
    """
    mine = _sections(config)
    best: tuple[str, list[str]] | None = None
    for name in PRESETS:
        reference = _reference_sections(name)
        diff = [f"{key}={value}" for key, value in mine.items() if value != reference[key]]
        if best is None or len(diff) < len(best[1]):
            best = (name, diff)
    assert best is not None
    return best


def describe_preset(config: Config) -> str:
    """`starpo_s`, or `custom (starpo_s with algo.gamma=0.99)`: the nearest preset and the config's own values."""
    name, diff = nearest_preset(config)
    return f"custom ({name} with {', '.join(diff)})" if diff else name


@lru_cache(maxsize=None)
def _reference_sections(name: str) -> dict[str, object]:
    """The preset's algo and filter keys: the schema's defaults with its overrides (built once a process)."""
    return _sections(load_config(None, PRESETS[name]))


def _sections(config: Config) -> dict[str, object]:
    # in the config's own section order, reading only the preset's sections
    return flatten({f.name: asdict(getattr(config, f.name)) for f in fields(config) if f.name in PRESET_SECTIONS})
