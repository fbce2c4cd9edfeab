"""A small project's params.yaml for the flow tests: the shipped file (every key DVC tracks) with small settings."""

from pathlib import Path

from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[2]
# three multi-turn and single-turn envs, a one-layer policy, two update steps on frozen_lake
SMALL = """\
envs: {tags: [sokoban, frozen_lake, countdown], train_size: 8, val_size: 4, test_size: 4}
model: {vocab_size: 320, hidden_size: 32, num_layers: 1, num_heads: 2, num_kv_heads: 1, intermediate_size: 64}
base: {tokenizer_episodes: 4, episodes_per_env: 6, steps: 3, batch_tokens: 400, warmup_steps: 1, eval_episodes: 2}
rollout: {max_new_tokens: 12}
filter: {keep_ratio: 0.5}
critic: {warmup_epochs: 2}
train: {env: frozen_lake, steps: 2, groups: 2, group_size: 2, eval_every: 2, eval_episodes: 2, mini_batch_size: 4}
eval: {episodes: 2}
"""


def write_params(path, *changes, small=SMALL):
    """path/params.yaml: the shipped params.yaml, then `small` (YAML), then `changes` (dotlist) on top."""
    cfg = OmegaConf.merge(OmegaConf.load(ROOT / "params.yaml"), OmegaConf.create(small),
                          OmegaConf.from_dotlist(list(changes)))
    OmegaConf.save(cfg, Path(path) / "params.yaml")
