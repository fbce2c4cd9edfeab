"""The typed schema of params.yaml (omegaconf structured configs) and `load_config`.

One dataclass per params.yaml section, one comment per field. Loading merges the schema's defaults, the yaml file
and `key=value` overrides in that order; an unknown key or a wrong type is a `ConfigError` naming the key.
Derived values are computed in code, never with `${}` interpolation (DVC tracks raw values per key).
"""

from __future__ import annotations

import difflib
import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, List, Sequence

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

DEFAULT_ENV_TAGS = ["bandit", "bandit_test", "bandit_rev", "sokoban", "sokoban_large", "sokoban_vocab", "frozen_lake",
                    "countdown"]


class ConfigError(ValueError):
    """params.yaml (or an override) does not fit the schema."""


@dataclass
class EnvsConfig:
    """Section `envs`: which environments exist for this pipeline and their instance tables (stage envgen)."""

    tags: List[str] = field(default_factory=lambda: list(DEFAULT_ENV_TAGS))  # env tags to generate tables for
    train_size: int = 1024  # instances in each env's train pool (seeds train_seed, train_seed + 1, ...)
    val_size: int = 256  # fixed validation instances per env (RAGEN: 256 seeds from 123)
    test_size: int = 256  # held-out test instances per env
    train_seed: int = 10000  # first train seed (RAGEN seed.train)
    val_seed: int = 123  # first val seed (RAGEN seed.val)
    test_seed: int = 1_000_000  # first test seed; the three seed ranges must not overlap


@dataclass
class ModelConfig:
    """Section `model`: the policy. `tiny` is built and warm-started by stage base; `hf` loads a local checkpoint."""

    source: str = "tiny"  # tiny (the embedded default, built here) | hf (a local Hugging Face checkpoint)
    path: str = ""  # hf only: local checkpoint directory (e.g. a Qwen2.5-0.5B-Instruct download); never fetched
    # hf only: a Jinja chat template file that replaces the checkpoint's own, for a checkpoint whose template
    # rewrites earlier turns (Qwen3's) or refuses a system message (Gemma 2's); empty: the checkpoint's own
    chat_template: str = ""
    vocab_size: int = 1024  # tiny: byte-level BPE trained on env text; the model gets 4 more ids (whole operators)
    # tiny: how a grid row of a state is tokenised. bpe: merged like any text, so a row splits into chunks such as
    # "#___" + "P#" whose cells have no fixed token offset; cells: one token per cell, so the cell below another is
    # always a row's width further on (bench/RESULTS.md, "Grid rows one cell a token")
    grid_tokens: str = "bpe"  # bpe | cells
    hidden_size: int = 192  # tiny: Qwen2 hidden size (with the defaults: 1.9 M parameters)
    num_layers: int = 4  # tiny: decoder layers
    num_heads: int = 6  # tiny: attention heads
    num_kv_heads: int = 3  # tiny: key/value heads (grouped-query attention)
    intermediate_size: int = 528  # tiny: MLP width
    max_positions: int = 2048  # tiny: context length in tokens
    device: str = "auto"  # auto (cuda when available, else cpu) | cpu | cuda
    dtype: str = "auto"  # auto (bf16-mixed on cuda, float32 on cpu) | float32 | bf16-mixed | bfloat16 | float16;
    #   bf16-mixed: float32 weights, bfloat16 compute (RAGEN's); bfloat16 / float16 weights lose small AdamW steps
    # auto: eager on cuda (our batches carry padding masks, for which torch's SDPA took a slow kernel on an H200:
    # eager sampled 2.2x (Qwen2.5-0.5B shape) to 9x (tiny) faster, bench/bench_cuda.py), sdpa on cpu
    attn: str = "auto"  # auto | sdpa | eager
    # torch's CPU threads in every torch stage: the same count sums in the same order on any machine (4 threads
    # warm-start another base than 2; bench/RESULTS.md, "Threads"); 2 is CI's count; 0: torch's own, one per core
    threads: int = 2
    seed: int = 0  # tiny: weight initialisation seed

    def tiny_shape(self) -> dict[str, int]:
        """The tiny model's size: the keyword arguments of `build_tiny_model` besides its tokenizer and seed."""
        return {"hidden_size": self.hidden_size, "num_layers": self.num_layers, "num_heads": self.num_heads,
                "num_kv_heads": self.num_kv_heads, "intermediate_size": self.intermediate_size,
                "max_positions": self.max_positions}

    def placement(self) -> dict[str, str]:
        """Where and how models load: the keyword arguments of `load_policy` / `load_critic`."""
        return {"device": self.device, "dtype": self.dtype, "attn": self.attn}


@dataclass
class BaseConfig:
    """Section `base`: the warm start of the tiny policy (stage base)."""

    mode: str = "warm"  # warm: well-formatted responses with random valid actions (no skill) | sft: solver demos
    # tokens the supervised loss covers: assistant (the responses) | all (every post-system token: also the env's
    # instruction and each state it shows after an action, so the base learns how actions change the grid: a world
    # model from random play, no skill)
    loss_mask: str = "assistant"
    envs: List[str] = field(default_factory=list)  # envs whose scripted conversations it trains on; [] = envs.tags
    tokenizer_episodes: int = 64  # episodes per env (think and no-think) whose text trains the tokenizer
    episodes_per_env: int = 384  # supervised conversations per multi-turn env (single-turn envs: x max_turns)
    steps: int = 1200  # optimizer steps (Countdown and Bandit stay above 95% format-valid at T=1 with a margin)
    batch_tokens: int = 6144  # tokens per step (many short conversations or a few long ones)
    lr: float = 0.003  # AdamW peak learning rate (linear warmup, cosine decay)
    warmup_steps: int = 20  # learning-rate warmup steps
    weight_decay: float = 0.01  # AdamW weight decay
    eval_episodes: int = 64  # val instances per env on which the base policy is measured (at most envs.val_size)
    seed: int = 0  # data and sampling seed


@dataclass
class RolloutConfig:
    """Section `rollout`: multi-turn episodes (RAGEN's agent_proxy and es_manager settings)."""

    max_turns: int = 5  # turns per episode (single-action envs always stop after 1)
    max_actions_per_turn: int = 5  # actions read from one answer; extra ones are dropped without penalty
    max_new_tokens: int = 48  # sampled tokens per turn (RAGEN gives Qwen 400; tiny responses are ~10 tokens)
    temperature: float = 1.0  # sampling temperature for training rollouts
    top_p: float = 1.0  # nucleus sampling mass
    top_k: int = 0  # keep the k most likely tokens; 0 = all
    enable_think: bool = True  # <think>...</think><answer>...</answer>; False: <answer> only
    format_penalty: float = -0.1  # added to the return for each turn that does not parse or names an invalid action
    # episodes sampled together at most: a rollout or evaluation plays its episodes in passes of this many, each
    # pass to its end, so the KV cache holds this many sequences (vLLM's max_num_seqs). 0: all at once, RAGEN's one
    # batch. A limit changes which random draws each episode gets, not what the experiment plays
    max_episodes_per_pass: int = 0


# The values of filter.mode; ragen.filters checks against the same tuple (it imports torch, this module must not)
FILTER_MODES = ("std", "std_rev", "nonzero", "top_p")
# The values of algo.symmetry; ragen.symmetry maps each to its transforms (it imports torch, this module must not)
SYMMETRY_MODES = ("none", "mirror", "flip", "rotate", "orbit")


@dataclass
class FilterConfig:
    """Section `filter`: StarPO-S uncertainty filtering (RAGEN rollout_filter_ratio / type)."""

    # keep the top int(keep_ratio * groups) groups by in-group return std; 1 = no filter. Under mode top_p: the
    # share of the batch's std mass the kept groups hold, e.g. 0.9
    keep_ratio: float = 0.25
    # std (most uncertain) | std_rev (least) | nonzero (DAPO: drop zero-variance groups) | top_p (RAGEN-2's
    # SNR-aware filter: the largest-std groups that hold keep_ratio of the std mass, none without a spread)
    mode: str = "std"
    # of a kept group: all (RAGEN) | best_success (its best successful rollout only; none without a success: the
    # filter of rejection-sampling fine-tuning, preset rft)
    within: str = "all"


@dataclass
class CriticConfig:
    """Section `critic`: the value model (PPO / GAE only) and its warm-up on the base rollouts (stage critic_fit)."""

    lr: float = 0.0001  # AdamW learning rate (RAGEN: 1e-5 for Qwen-0.5B; the tiny model needs more)
    warmup_epochs: int = 20  # passes over the filtered base rollouts in critic_fit
    value_clip: float = 0.5  # clip of V around the old value in the value loss
    ppo_epochs: int = 0  # the critic's passes over each step's batch in update (verl critic.ppo_epochs); 0: as
    #   many as the actor's (train.ppo_epochs). More passes fit the values of a batch the actor steps on once


@dataclass
class AlgoConfig:
    """Section `algo`: StarPO's estimator and loss. Presets: see README (starpo_s, starpo_ppo, starpo_grpo)."""

    advantage: str = "gae"  # gae (PPO with the critic; whitened) | bilevel_gae (turn-level, then token-level GAE)
    #                         | grpo (group-normalised return, no critic) | rft (1 on every kept token, no critic;
    #                         with filter.within best_success: rejection-sampling fine-tuning, preset rft)
    gamma: float = 1.0  # GAE discount (between tokens)
    lam: float = 1.0  # GAE lambda (both levels)
    turn_gamma: float = 0.95  # bilevel_gae: discount between turns (RAGEN high_level_gamma)
    # grpo divides each group's centred returns by their std (RAGEN, DeepSeekMath); false: Dr. GRPO (Liu et al. 2025;
    # verl norm_adv_by_std_in_grpo=False): a group that differs only in step penalties keeps advantages of their size
    grpo_by_std: bool = True
    reward_norm: str = "identity"  # return normalisation: identity | mean | mean_std | asym_clip
    # over which trajectories reward_norm normalises (RAGEN reward_normalization.grouping): state (the N rollouts of
    # one initial state) | inductive (every rollout of one env tag) | batch (the whole step's batch)
    reward_norm_grouping: str = "state"
    clip_eps_low: float = 0.2  # ratio clipped below at 1 - eps_low
    clip_eps_high: float = 0.28  # ratio clipped above at 1 + eps_high (StarPO-S clip-higher; vanilla 0.2)
    dual_clip: float = 0.0  # dual-clip constant c for negative advantages (RAGEN main: 3); 0 = off
    entropy_coef: float = 0.001  # entropy bonus coefficient
    kl: str = "none"  # none | reward_k1 (PPO, paper runs) | loss_k1 (GRPO, paper runs) | loss_k3
    kl_coef: float = 0.0  # KL coefficient against the frozen base policy (vanilla StarPO: 0.001)
    aggregation: str = "token-mean"  # token-mean | seq-mean-token-mean
    loss_mask: str = "assistant"  # assistant (sampled tokens) | all (every post-system token, as the paper's runs)
    # log pi_old of the PPO ratio: rescore (a no-grad pass of the trainer over the kept batch, RAGEN) | sampler (the
    # rollout's own log-probs of its sampled tokens: the same policy and ids, so equal up to float error, without
    # that pass; needs loss_mask assistant, as only sampled tokens have one)
    old_logprobs: str = "rescore"
    reward_placement: str = "last"  # last (return on the last token) | turn (each turn's reward at its end)
    # what a trajectory scores before reward_norm: return (env rewards + format penalties, RAGEN) | best_success (1 for
    # its group's best success, the highest return then the fewest actions; 0 for the rest; not RAGEN's)
    outcome: str = "return"
    # a bonus added to each return before reward_norm, for the first action's spread (ragen.diagnostics): none |
    # entropy (-ln p(a) over the batch: against a template collapse) | mi (ln p(a | x) - ln p(a): the opening's
    # pointwise information on the instance); not RAGEN's. Scaled by first_action_coef (nats -> return units)
    first_action_bonus: str = "none"
    first_action_coef: float = 1.0
    # potential-based shaping of the training rollouts' turn rewards (ragen.shaping; not RAGEN's): none | solver (c *
    # (Phi(after) - Phi(before)) per turn, Phi from the exact solver: minus the moves left on Sokoban, the best
    # success probability left on FrozenLake); c = shaping_coef. It sums to c * (Phi(end) - Phi(start)) over an
    # episode, so its credit per turn needs algo.reward_placement turn. Evaluation is never shaped
    shaping: str = "none"
    shaping_coef: float = 1.0
    # copies of each kept trajectory under the grid's symmetries, trained on with its score (ragen.symmetry; not
    # RAGEN's): none | mirror (left-right, Left and Right swapped) | flip (upside down) | rotate (the three quarter,
    # half and three-quarter turns) | orbit (all seven symmetries of a square: rotate, mirror, flip and the two
    # diagonal reflections). Grid-symmetric envs only (Sokoban). The batch grows 2x (4x rotate, 8x orbit): scale
    # train.mini_batch_size alike to keep the optimizer steps a step
    symmetry: str = "none"


@dataclass
class TrainConfig:
    """Section `train`: the online StarPO loop (stage update)."""

    env: str = "bandit"  # env tag to train on
    steps: int = 40  # policy updates (RAGEN: 200)
    groups: int = 8  # P: env groups per step (distinct initial states)
    group_size: int = 16  # N: rollouts per group (same seed: same start and env randomness)
    max_optimal_moves: int = 0  # curriculum: train only on instances the solver solves in at most this many
    #   moves (envgen's optimal_moves; unsolvable ones drop out); 0 trains on the whole train split
    lr: float = 0.0001  # actor AdamW learning rate (RAGEN: 1e-6 for Qwen-0.5B; the tiny model needs more)
    weight_decay: float = 0.01  # AdamW weight decay, actor and critic
    grad_clip: float = 1.0  # gradient-norm clip
    mini_batch_size: int = 32  # trajectories per optimizer step (RAGEN ppo_mini_batch_size)
    micro_batch_size: int = 0  # trajectories per forward and backward pass, gradients accumulated to the mini-batch's
    #   exactly (RAGEN micro_batch_size_per_gpu: 1, or 4 in the paper's version); bounds memory only; 0: all at once
    micro_batch_tokens: int = 0  # padded tokens per pass at most (rows x the pass's longest; verl use_dynamic_bsz
    #   bounds passes by tokens too); 0: no limit. Either limit runs rows in order of length, longest first
    ppo_epochs: int = 1  # passes over each step's batch, critic and actor (RAGEN ppo_epochs)
    eval_every: int = 10  # steps between val evaluations (and before training)
    eval_episodes: int = 64  # val instances per evaluation
    val_envs: List[str] = field(default_factory=list)  # more envs those evaluations play beside train.env (which
    #   is always played), e.g. [sokoban_vocab, sokoban_large, frozen_lake]: RAGEN's generalisation val; [] none
    checkpoint_every: int = 5  # steps between resumable checkpoints
    seed: int = 0  # sampling seed

    def val_tags(self) -> list[str]:
        """The envs the loop's evaluations play: train.env, then train.val_envs (train.env listed there again
        changes nothing)."""
        return [self.env] + [tag for tag in self.val_envs if tag != self.env]


@dataclass
class EvalConfig:
    """Section `eval`: stage evaluate and the val checks during training."""

    temperature: float = 0.5  # RAGEN's validation temperature
    episodes: int = 256  # instances per split (at most the split's size); RAGEN validates on 256 fixed seeds
    samples: int = 1  # episodes per instance (RAGEN: 1); more estimate each instance's success rate more tightly
    # stage evaluate also plays the base policy (models/base) on the same instances with the same random stream, so
    # eval.json holds the base's success and the paired trained-minus-base gap with its standard error
    against_base: bool = True


@dataclass
class TrackingConfig:
    """Section `tracking`: where MLflow runs go. Not a DVC param: changing it reruns nothing."""

    uri: str = ""  # MLflow tracking URI; "" = $MLFLOW_TRACKING_URI if set, else sqlite in ./mlruns/
    experiment: str = "ragen"  # MLflow experiment name
    pipeline_run: str = ""  # id shared by the stage runs of one pipeline run; "" = derived from config + git commit
    parent_run_id: str = ""  # MLflow run that the pipeline run nests under (set by `ragen ablate`)
    ablation_set: str = ""  # tag: the ablation set this run belongs to (set by `ragen ablate`)
    variant: str = ""  # tag: the variant of the ablation set


@dataclass
class Config:
    envs: EnvsConfig = field(default_factory=EnvsConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    base: BaseConfig = field(default_factory=BaseConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    filter: FilterConfig = field(default_factory=FilterConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)


def load_config(path: str | Path | None = "params.yaml", overrides: Sequence[str] = ()) -> Config:
    """Schema defaults <- params.yaml <- `key=value` overrides, validated.

    Raises:
        ConfigError: an unknown key, a wrong type, a malformed file or an invalid value, naming the key.
    """
    schema, files = OmegaConf.structured(Config), []
    if path is not None:
        path = Path(path)
        if not path.exists():
            raise ConfigError(f"{path}: no such params file (run from the project root, or pass the path)")
        try:
            files.append(OmegaConf.load(path))
        except Exception as error:  # yaml syntax errors come in several types
            raise ConfigError(f"{path}: not valid YAML: {error}") from None
    from ragen.presets import expand_presets

    try:
        overrides = expand_presets(list(overrides))
    except KeyError as error:
        raise ConfigError(str(error.args[0])) from None
    malformed = [item for item in overrides if "=" not in item]
    if malformed:
        raise ConfigError(f"override {malformed[0]!r} is not key=value; write e.g. train.steps=10")
    try:  # all at once; when refused, again one source at a time, so that the one refused is named
        merged = OmegaConf.merge(schema, *files, OmegaConf.from_dotlist(list(overrides)))
    except (OmegaConfBaseException, yaml.YAMLError):
        merged = schema
        for source, layer in [(f"{path}", file) for file in files] + [(f"override {o!r}", o) for o in overrides]:
            merged = _merge(merged, layer, source)
    try:
        config: Config = OmegaConf.to_object(merged)
    except OmegaConfBaseException as error:
        raise ConfigError(_explain(error, f"{path}" if path is not None else "config")) from None
    validate(config)
    return config


def _merge(merged: Any, layer: Any, source: str) -> Any:
    """`merged` <- `layer` (a loaded file, or one `key=value` override); ConfigError naming `source` if refused."""
    try:
        return OmegaConf.merge(merged, OmegaConf.from_dotlist([layer]) if isinstance(layer, str) else layer)
    except OmegaConfBaseException as error:
        raise ConfigError(_explain(error, source)) from None
    except yaml.YAMLError as error:  # an override's value is read as YAML: `envs.tags=[a,` ends the text too soon
        reason = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise ConfigError(f"{source}: the value is not valid YAML ({reason}); quote it or close its brackets, e.g. "
                          "envs.tags=[bandit,sokoban]") from None


def _explain(error: OmegaConfBaseException, source: str) -> str:
    key = getattr(error, "full_key", None) or "?"
    if isinstance(error, ConfigKeyError):
        section, name = key.rsplit(".", 1) if "." in key else ("", key)
        keys = _known_keys(section)
        where = f"under '{section}'" if section else "at the top level"
        hint = did_you_mean(name, keys, prefix=f"{section}." if section else "")
        return f"{source}: unknown key '{key}'{hint}; known keys {where}: {', '.join(keys)}"
    reason = str(error).splitlines()[0]
    if "is not a ListConfig, list or tuple" in reason:  # a scalar where the schema has a list
        return f"{source}: '{key}' takes a list, e.g. {key}=[a,b] (in params.yaml: {key.split('.')[-1]}: [a, b])"
    return f"{source}: bad value for '{key}': {reason}"


def did_you_mean(word: str, known: Sequence[str], prefix: str = "") -> str:
    """The hint for a misspelt `word`: ` (did you mean '<prefix><nearest>'?)` with difflib's nearest known name, or
    "" when none is near; every refused key's, here, in ablations.yaml and in the nightly spec."""
    close = difflib.get_close_matches(word, list(known), n=1)
    return f" (did you mean '{prefix}{close[0]}'?)" if close else ""


def _known_keys(section: str) -> list[str]:
    node: Any = asdict(Config())
    for part in filter(None, section.split(".")):
        if not isinstance(node, dict) or part not in node:
            return []
        node = node[part]
    return list(node) if isinstance(node, dict) else []


def validate(config: Config) -> None:
    """Checks the schema cannot express: known env tags, positive sizes, disjoint seed ranges."""
    from ragen.envs import ENVS

    envs = config.envs
    check_tags("envs.tags", envs.tags)
    if not envs.tags:
        raise ConfigError("envs.tags: empty; name at least one env")
    check_tags("base.envs", config.base.envs, within=envs.tags, seeds="train",
               fix=f"pick from {envs.tags} or leave base.envs empty for all of them")
    check_tags("train.val_envs", config.train.val_envs, within=envs.tags, seeds="val",
               fix=f"add {{them}} to envs.tags, or pick from {envs.tags}")
    ranges = {}
    for split in ("train", "val", "test"):
        size, seed = getattr(envs, f"{split}_size"), getattr(envs, f"{split}_seed")
        if size <= 0:
            raise ConfigError(f"envs.{split}_size must be positive, got {size}")
        if seed < 0:
            raise ConfigError(f"envs.{split}_seed must be non-negative, got {seed}")
        ranges[split] = (seed, seed + size)
    a = config.algo
    choices = {"model.source": (config.model.source, ("tiny", "hf")), "base.mode": (config.base.mode, ("warm", "sft")),
               "base.loss_mask": (config.base.loss_mask, ("assistant", "all")),
               "filter.mode": (config.filter.mode, FILTER_MODES),
               "filter.within": (config.filter.within, ("all", "best_success")),
               "algo.advantage": (a.advantage, ("gae", "bilevel_gae", "grpo", "rft")),
               "algo.reward_norm": (a.reward_norm, ("identity", "mean", "mean_std", "asym_clip")),
               "algo.reward_norm_grouping": (a.reward_norm_grouping, ("state", "inductive", "batch")),
               "algo.kl": (a.kl, ("none", "reward_k1", "loss_k1", "loss_k3")),
               "algo.aggregation": (a.aggregation, ("token-mean", "seq-mean-token-mean")),
               "algo.loss_mask": (a.loss_mask, ("assistant", "all")),
               "algo.old_logprobs": (a.old_logprobs, ("rescore", "sampler")),
               "algo.reward_placement": (a.reward_placement, ("last", "turn")),
               "algo.outcome": (a.outcome, ("return", "best_success")),
               "algo.first_action_bonus": (a.first_action_bonus, ("none", "entropy", "mi")),
               "algo.shaping": (a.shaping, ("none", "solver")),
               "algo.symmetry": (a.symmetry, SYMMETRY_MODES),
               "train.env": (config.train.env, tuple(ENVS)),
               "model.device": (config.model.device, ("auto", "cpu", "cuda")),
               "model.dtype": (config.model.dtype, ("auto", "float32", "bf16-mixed", "bfloat16", "float16")),
               "model.attn": (config.model.attn, ("auto", "sdpa", "eager")),
               "model.grid_tokens": (config.model.grid_tokens, ("bpe", "cells"))}
    for key, (value, allowed) in choices.items():
        if value not in allowed:
            raise ConfigError(f"{key}: {value!r} is not one of {', '.join(allowed)}{did_you_mean(str(value), allowed)}")
    if config.model.source == "hf" and not config.model.path:
        raise ConfigError("model.path: empty; model.source hf needs a local checkpoint directory")
    if config.model.chat_template and config.model.source != "hf":
        raise ConfigError("model.chat_template: applies to model.source hf only (the tiny policy's template comes "
                          "with its tokenizer); leave it empty, or set model.source=hf")
    if config.model.hidden_size % config.model.num_heads or config.model.num_heads % config.model.num_kv_heads:
        raise ConfigError("model: hidden_size must be divisible by num_heads, and num_heads by num_kv_heads")
    check_ranges(config)
    if not 0.0 < config.filter.keep_ratio <= 1.0:
        raise ConfigError(f"filter.keep_ratio must be in (0, 1], got {config.filter.keep_ratio}")
    if config.train.groups * config.train.group_size < 2:
        raise ConfigError("train: need groups * group_size >= 2 trajectories per step")
    if a.outcome != "return" and a.reward_placement != "last":
        raise ConfigError(f"algo.outcome {a.outcome} scores whole trajectories, so it needs algo.reward_placement=last "
                          f"(per-turn rewards are the env's own)")
    if a.first_action_bonus != "none" and a.reward_placement != "last":
        raise ConfigError(f"algo.first_action_bonus {a.first_action_bonus} adds to whole-trajectory returns, so it "
                          "needs algo.reward_placement=last (per-turn rewards are the env's own)")
    if a.shaping != "none":
        from ragen.shaping import shapeable

        if not shapeable(config.train.env):
            raise ConfigError(f"algo.shaping {a.shaping}: train.env {config.train.env} has no solver potential (the "
                              "Sokoban envs and frozen_lake have one); set algo.shaping=none")
        if a.shaping_coef <= 0:
            raise ConfigError(f"algo.shaping_coef must be > 0 (a negative one would pay for moving away from the "
                              f"solution), got {a.shaping_coef}")
    if a.symmetry != "none":
        from ragen.envs import grid_symmetric

        if not grid_symmetric(config.train.env):
            symmetric = [tag for tag in ENVS if grid_symmetric(tag)]
            raise ConfigError(f"algo.symmetry {a.symmetry}: train.env {config.train.env} has no grid whose mirror "
                              f"plays alike (the grid-symmetric envs: {', '.join(symmetric)}); set algo.symmetry=none")
        if a.old_logprobs != "rescore":
            raise ConfigError(f"algo.symmetry {a.symmetry} needs algo.old_logprobs=rescore: the sampler never drew the "
                              "copies, so only the trainer's re-scoring gives them old log-probs")
    if a.old_logprobs == "sampler" and a.loss_mask != "assistant":
        raise ConfigError(f"algo.old_logprobs sampler needs algo.loss_mask=assistant: loss_mask {a.loss_mask} also "
                          "trains on environment tokens, which the sampler did not draw and has no log-prob for; use "
                          "algo.old_logprobs=rescore")
    if not 0.0 < config.rollout.top_p <= 1.0 or config.rollout.temperature < 0 or config.rollout.top_k < 0:
        raise ConfigError("rollout: need 0 < top_p <= 1, temperature >= 0 and top_k >= 0")
    splits = list(ranges)
    for i, a in enumerate(splits):
        for b in splits[i + 1 :]:
            (a0, a1), (b0, b1) = ranges[a], ranges[b]
            if a0 < b1 and b0 < a1:
                raise ConfigError(
                    f"envs: {a} seeds [{a0}, {a1}) overlap {b} seeds [{b0}, {b1}); move envs.{b}_seed so splits "
                    "stay disjoint")


# numeric knobs and the bound each must keep; a value outside stops the run before it starts, naming the key and the
# bound (and, from HINTS, what the edge value means)
AT_LEAST_ONE = ["model.vocab_size", "model.hidden_size", "model.num_layers", "model.num_heads", "model.num_kv_heads",
                "model.intermediate_size", "model.max_positions", "base.tokenizer_episodes", "base.episodes_per_env",
                "base.steps", "base.batch_tokens", "base.eval_episodes", "rollout.max_turns",
                "rollout.max_actions_per_turn", "rollout.max_new_tokens", "train.steps", "train.groups",
                "train.group_size", "train.mini_batch_size", "train.ppo_epochs", "train.eval_every",
                "train.eval_episodes", "train.checkpoint_every", "eval.episodes", "eval.samples"]
NON_NEGATIVE = ["model.threads", "base.warmup_steps", "base.weight_decay", "train.weight_decay",
                "train.max_optimal_moves", "train.micro_batch_size", "train.micro_batch_tokens",
                "rollout.max_episodes_per_pass",
                "critic.warmup_epochs", "critic.ppo_epochs", "algo.entropy_coef", "algo.kl_coef",
                "algo.first_action_coef", "eval.temperature"]
POSITIVE = ["base.lr", "train.lr", "critic.lr", "train.grad_clip", "critic.value_clip", "algo.clip_eps_high"]
UNIT_INTERVAL = ["algo.gamma", "algo.lam", "algo.turn_gamma"]  # discounts and lambdas
BOUNDS = [(AT_LEAST_ONE, ">= 1", lambda x: x >= 1), (NON_NEGATIVE, ">= 0", lambda x: x >= 0),
          (POSITIVE, "> 0", lambda x: x > 0), (UNIT_INTERVAL, "in [0, 1]", lambda x: 0.0 <= x <= 1.0)]
HINTS = {"eval.samples": "episodes per val or test instance", "train.max_optimal_moves": "0: no limit",
         "model.threads": "0: torch's own count, one per core",
         "train.micro_batch_size": "0: the whole mini-batch in one pass",
         "train.micro_batch_tokens": "0: no limit on a pass's padded tokens",
         "rollout.max_episodes_per_pass": "0: every episode of a rollout sampled at once",
         "critic.warmup_epochs": "0: the critic starts unwarmed, a zero value head",
         "critic.ppo_epochs": "0: as many as train.ppo_epochs",
         "algo.first_action_coef": "a negative one would pay for a template"}


def check_tags(key: str, tags: list[str], within: list[str] | None = None, seeds: str = "", fix: str = "") -> None:
    """`key`'s env tags: each a known env (the nearest named for a typo), each once, and each among `within` (envs.tags,
    the only envs with generated `seeds`) when given; `fix` says what to do then ("{them}": it or them)."""
    from ragen.envs import ENVS

    for tag in tags:
        if tag not in ENVS:
            raise ConfigError(f"{key}: unknown env tag {tag!r}{did_you_mean(tag, list(ENVS))}; known tags: "
                              f"{', '.join(ENVS)}")
    if len(set(tags)) != len(tags):
        raise ConfigError(f"{key}: duplicate tags in {tags}; name each env once")
    outside = [tag for tag in tags if within is not None and tag not in within]
    if outside:
        them = "them" if len(outside) > 1 else "it"
        raise ConfigError(f"{key}: {outside} not in envs.tags (only those have generated {seeds} seeds); "
                          f"{fix.format(them=them)}")


def check_ranges(config: Config) -> None:
    """The numeric bounds the schema's types cannot express (sizes, rates, discounts, clip constants)."""
    flat = flatten(to_dict(config))
    for keys, bound, holds in BOUNDS:
        for key in keys:
            if not holds(flat[key]):
                hint = f" ({HINTS[key]})" if key in HINTS else ""
                raise ConfigError(f"{key} must be {bound}{hint}, got {flat[key]}")
    a = config.algo
    if not 0.0 < a.clip_eps_low < 1.0:
        raise ConfigError(f"algo.clip_eps_low must be in (0, 1) (the ratio is clipped below at 1 - eps_low), got "
                          f"{a.clip_eps_low}")
    if a.dual_clip != 0 and not a.dual_clip > 1:
        raise ConfigError(f"algo.dual_clip must be 0 (off) or > 1 (RAGEN: 3), got {a.dual_clip}")
    if config.rollout.format_penalty > 0:
        raise ConfigError(f"rollout.format_penalty must be <= 0 (a positive one would pay for malformed answers), got "
                          f"{config.rollout.format_penalty}")


def to_dict(config: Config) -> dict[str, Any]:
    return asdict(config)


def config_digest(config: Config, *extra: Any) -> str:
    """sha256 (hex) of the resolved config without its tracking section (where runs are logged changes no
    result), and of any `extra` json values (e.g. a git commit)."""
    relevant = {k: v for k, v in to_dict(config).items() if k != "tracking"}
    payload = [relevant, *extra] if extra else relevant
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"envs": {"tags": [...]}} -> {"envs.tags": [...]} (for MLflow params)."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat
