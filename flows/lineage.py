"""The settings each output of the RL chain was made with, and a stage's refusal of inputs made with other ones.

Under `dvc repro` every stage reads params.yaml and DVC reruns a stage whose params changed, so a stage's inputs
always come from its own settings. A stage run by hand with overrides (`python -m flows.update
train.env=frozen_lake`), or after params.yaml changed, had no such guarantee: update trained its first step on the
bandit batch stage filter had kept and said nothing. So stages rollout, filter and critic_fit record in their output
the settings that decide it, by stage (`KEYS`: each stage's keys, less those that change memory or placement only),
with the settings their own input recorded; the stages that read those outputs (filter, critic_fit, update) compare
them with their own and refuse a difference, naming each setting and the stages to rerun with the run's settings.
update records its own in the trained policy's meta, which stage report compares with the settings it describes.
evaluate refuses a policy trained on another env than its train.env. An output without a record (written before
records, or by a test or benchmark by hand) is taken as it is; models/base is shared as it is by design (every
ablation variant trains from it).
"""

from __future__ import annotations

from typing import Any

from ragen.config import Config, flatten, to_dict
from ragen.fileio import REBUILD, StageFileError

Record = dict[str, dict[str, Any]]  # stage -> {"section.key": value} it ran with

CHAIN = ("rollout", "filter", "critic_fit", "update")
# the keys each stage reads that decide its output (tests/flows/test_stage_inputs.py checks them against the keys
# it reads); a name ending in "." stands for its whole section
KEYS = {
    "rollout": ("train.env", "train.groups", "train.group_size", "train.seed", "train.max_optimal_moves", "rollout.",
                "algo.shaping", "algo.shaping_coef"),
    "filter": ("filter.", "algo.outcome", "algo.first_action_bonus", "algo.first_action_coef", "algo.reward_norm",
               "algo.reward_norm_grouping"),
    "critic_fit": ("critic.lr", "critic.warmup_epochs", "algo.advantage", "algo.gamma", "algo.turn_gamma",
                   "algo.loss_mask", "algo.reward_placement", "train.mini_batch_size", "train.grad_clip",
                   "train.weight_decay", "train.seed"),
    "update": ("rollout.", "filter.", "critic.", "algo.", "train.", "eval.temperature"),
}
# read by those stages, but they change memory, where the model runs or how many threads add its sums up (last bits),
# not what the output holds
NOT_DECIDING = ("train.micro_batch_size", "train.micro_batch_tokens", "model.device", "model.dtype", "model.attn",
                "model.threads")


class OtherSettings(StageFileError):
    """An input made with other settings than this run's (a stage run by hand with overrides, or params changed)."""


def own_settings(stage: str, cfg: Config) -> dict[str, Any]:
    """{"section.key": value} of the keys `stage` records (`KEYS`, less `NOT_DECIDING`), as `cfg` has them."""
    keys = KEYS[stage]
    return {key: value for key, value in flatten(to_dict(cfg)).items() if key not in NOT_DECIDING
            and (key in keys or any(name.endswith(".") and key.startswith(name) for name in keys))}


def made_with(stage: str, cfg: Config, inputs: Record | None = None) -> Record:
    """The record of an output of `stage`: its input's record and its own settings."""
    return {**(inputs or {}), stage: own_settings(stage, cfg)}


def differences(path: str, record: Record | None, cfg: Config) -> list[tuple[str, str, Any, Any]]:
    """(stage, key, the value it ran with, this run's) for each setting `path`'s record holds otherwise than `cfg`, in
    chain order; none without a record. StageFileError naming `path` for a record of another shape."""
    if record is None:
        return []
    if not (isinstance(record, dict) and all(isinstance(v, dict) for v in record.values())):
        raise StageFileError(f"{path}: its settings record is not a mapping of stage to settings; {REBUILD}")
    ours = flatten(to_dict(cfg))
    return [(stage, key, value, ours.get(key)) for stage in CHAIN if stage in record
            for key, value in sorted(record[stage].items()) if ours.get(key) != value]


def check_input(path: str, record: Record | None, cfg: Config, stage: str, overrides: list[str] | None) -> None:
    """Raise OtherSettings when `path` (an input of `stage`) was made with other settings than `cfg`'s: each
    setting, the stage that ran with it, and the stages to rerun first. None (no record) passes."""
    found = differences(path, record, cfg)
    if not found:
        return
    said = "; ".join(f"{key}={value} in stage {made_by} (this run: {ours})" for made_by, key, value, ours in found)
    rerun = CHAIN[CHAIN.index(found[0][0]):CHAIN.index(stage)]
    names = " and ".join([", ".join(rerun[:-1]), rerun[-1]] if len(rerun) > 1 else rerun)
    command = " ".join(["python -m flows." + rerun[0], *(overrides or [])])
    raise OtherSettings(
        f"{path} was made with other settings than this run's: {said}; run stage{'s' * (len(rerun) > 1)} {names} "
        f"with this run's settings first (`{command}`{', then the next likewise' * (len(rerun) > 1)}), or the "
        "whole pipeline with them: `dvc repro` after editing params.yaml, or `dvc exp run -S key=value ...`")


def check_policy_env(path: str, meta: dict[str, Any], cfg: Config) -> None:
    """Raise OtherSettings when the policy in `path` (its meta) was trained on another env than train.env: its
    val and test splits, generalisation envs and base comparison would all be of the wrong env."""
    trained = meta.get("env")
    if trained is not None and trained != cfg.train.env:
        raise OtherSettings(f"{path} was trained on {trained}, and this run evaluates train.env={cfg.train.env}; "
                            f"evaluate it with train.env={trained}, or train a policy on {cfg.train.env} first")
