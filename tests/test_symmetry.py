"""Copies of trajectories under a grid's symmetries: the transforms by hand, replayed copies, the config's checks."""

from dataclasses import replace

import pytest
import torch

from ragen.advantages import compute_grpo_advantages
from ragen.config import ConfigError, RolloutConfig, load_config
from ragen.envs import grid_symmetric
from ragen.policy.chat import ChatRenderer
from ragen.prompting import parse_response
from ragen.records import EpisodeSpec
from ragen.rollout import run_episodes
from ragen.envs import make_env
from ragen.symmetry import SYMMETRIES, TRANSFORMS, direction_map, transform_grid, transform_text, with_copies
from tests.test_rollout import scripted, tokenizer  # noqa: F401  (the module fixture)

CORRIDOR = "######\n#P_XO#\n######"  # Right walks, a second Right pushes the box home
COLUMN = "#####\n#_O_#\n#_X_#\n#_P_#\n#####"  # one Up pushes the box home


def played(tokenizer, layout, responses, groups=(0,)):  # noqa: F811
    renderer = ChatRenderer(tokenizer, "<think>")
    specs = [EpisodeSpec("sokoban", 7, g, layout) for g in groups]
    return run_episodes(specs, scripted(tokenizer, responses), renderer, RolloutConfig(), max_positions=4096), renderer


def test_grids_by_hand():
    assert transform_grid(CORRIDOR, "mirror") == "######\n#OX_P#\n######"
    assert transform_grid(COLUMN, "flip") == "#####\n#_P_#\n#_X_#\n#_O_#\n#####"
    assert transform_grid("#P_\n__X", "half_turn") == "X__\n_P#"
    assert transform_grid("#P_\n__X", "mirror") == "_P#\nX__"
    # the turns and diagonals of a 2 x 3 grid are 3 x 2: clockwise, the left column read upwards becomes the top row
    assert transform_grid("#P_\n__X", "quarter_turn") == "_#\n_P\nX_"
    assert transform_grid("#P_\n__X", "three_quarter_turn") == "_X\nP_\n#_"
    assert transform_grid("#P_\n__X", "transpose") == "#_\nP_\n_X"
    assert transform_grid("#P_\n__X", "anti_transpose") == "X_\n_P\n_#"


def test_each_transform_moves_the_directions_as_it_moves_the_grid():
    assert direction_map("quarter_turn") == {"up": "right", "right": "down", "down": "left", "left": "up"}
    assert direction_map("three_quarter_turn") == {"up": "left", "left": "down", "down": "right", "right": "up"}
    assert direction_map("transpose") == {"up": "left", "left": "up", "down": "right", "right": "down"}
    assert direction_map("anti_transpose") == {"up": "right", "right": "up", "down": "left", "left": "down"}
    # a move on the transformed grid lands where the transform puts the original move's landing cell
    board = "#####\n#O__#\n#_P_#\n#__X#\n#####"
    for name in TRANSFORMS:
        for action, new in direction_map(name).items():
            original, copy = make_env("sokoban"), make_env("sokoban")
            original.reset(seed=0, options={"layout": board})
            copy.reset(seed=0, options={"layout": transform_grid(board, name)})
            original.step(action)
            copy.step(new)
            assert copy.render() == transform_grid(original.render(), name), (name, action)
    # rotate and orbit take each direction to every other one equally often
    for mode, per_direction in (("rotate", 1), ("orbit", 2)):
        landed = [direction_map(name)["up"] for name in SYMMETRIES[mode]] + ["up"]
        assert sorted(landed) == sorted(["up", "down", "left", "right"] * per_direction), mode


def test_direction_words_swap_whole_and_in_their_case():
    text = "I will move Left. Left || up || RIGHT || Upper || left-right</answer>"
    assert transform_text(text, "mirror") == "I will move Right. Right || up || LEFT || Upper || right-left</answer>"
    assert transform_text(text, "flip") == "I will move Left. Left || down || RIGHT || Upper || left-right</answer>"
    assert transform_text("Up || Left", "half_turn") == "Down || Right"
    assert transform_text("Up || Left || right || DOWN", "quarter_turn") == "Right || Up || down || LEFT"
    assert SYMMETRIES["rotate"] == ("quarter_turn", "half_turn", "three_quarter_turn") and SYMMETRIES["none"] == ()
    assert len(SYMMETRIES["orbit"]) == 7


def test_a_copy_replays_the_mirrored_play_with_its_rewards(tokenizer):  # noqa: F811
    (original,), renderer = played(tokenizer, CORRIDOR, [" I will move Left.</think><answer>Left || Right</answer>",
                                                         " Moving Right looks fine.</think><answer>Right</answer>"])
    assert original.success and len(original.turns) == 2
    out, origin, dropped = with_copies([original], "mirror", renderer, RolloutConfig(), max_positions=4096)
    assert dropped == 0 and origin == [0, 0] and out[0] is original
    copy = out[1]
    assert copy.turns[0].state == "######\n#OX_P#\n######"
    assert [t.response for t in copy.turns] == [" I will move Right.</think><answer>Right || Left</answer>",
                                                " Moving Left looks fine.</think><answer>Left</answer>"]
    assert [t.reward for t in copy.turns] == [t.reward for t in original.turns]
    assert (copy.success, copy.traj_return, copy.num_actions, copy.end_reason) == (
        True, original.traj_return, 3, original.end_reason)
    assert copy.group_id == 1 and copy.seed == original.seed  # span 1: the copy's group is group 0 + 1
    # the copy's sequence is a rollout's: its sampled tokens are exactly its responses, re-tokenised
    ids = torch.tensor(copy.token_ids)
    mask = torch.tensor(copy.sampled_mask)
    assert tokenizer.decode(ids[mask].tolist()) == "".join(t.response for t in copy.turns)
    assert [copy.token_ids[e] for e in copy.turn_ends] == [t.response_ids[-1] for t in copy.turns]


def test_rotate_copies_each_trajectory_three_times_into_groups_apart(tokenizer):  # noqa: F811
    trajectories, renderer = played(tokenizer, COLUMN, [" Go.</think><answer>Up</answer>"], groups=(0, 0, 1))
    assert all(t.success for t in trajectories)
    out, origin, dropped = with_copies(trajectories, "rotate", renderer, RolloutConfig(), max_positions=4096)
    assert dropped == 0 and origin == [0] * 4 + [1] * 4 + [2] * 4
    # span 2 (groups 0 and 1): quarter-turn copies join groups +2, half +4, three-quarter +6, each after its original
    assert [t.group_id for t in out] == [0, 2, 4, 6, 0, 2, 4, 6, 1, 3, 5, 7]
    assert [t.turns[0].actions for t in out[:4]] == [("Up",), ("Right",), ("Down",), ("Left",)]
    assert [t.turns[0].state for t in out[1:4]] == ["#####\n#___#\n#PXO#\n#___#\n#####", transform_grid(COLUMN, "flip"),
                                                    "#####\n#___#\n#OXP#\n#___#\n#####"]
    # GRPO over originals and copies: each copy's advantage equals its original's
    scores = torch.tensor([1.0, 2.0, 0.0])[torch.tensor(origin)]  # (12,) as ragen.train.add_copies gathers them
    group_ids = torch.tensor([t.group_id for t in out])
    advantages, _ = compute_grpo_advantages(scores, group_ids, torch.ones(12, 1, dtype=torch.bool))
    assert torch.equal(advantages[1:4, 0], advantages[0, 0].expand(3)) and advantages[0, 0] != 0
    out, _, dropped = with_copies(trajectories[:1], "orbit", renderer, RolloutConfig(), max_positions=4096)
    assert dropped == 0 and len(out) == 8 and all(t.success for t in out)
    assert sorted(t.turns[0].actions[0] for t in out) == ["Down", "Down", "Left", "Left", "Right", "Right", "Up", "Up"]


def test_a_copy_that_does_not_replay_its_original_is_dropped(tokenizer):  # noqa: F811
    (original,), renderer = played(tokenizer, COLUMN, [" Go.</think><answer>Up</answer>"])
    forged = replace(original, success=False)  # a record the env cannot reproduce
    out, origin, dropped = with_copies([forged], "mirror", renderer, RolloutConfig(), max_positions=4096)
    assert (out, origin, dropped) == ([forged], [0], 1)
    # a response that does not parse stays unparsable in the copy, with the same penalty
    (bad,), _ = played(tokenizer, COLUMN, [" Go.</think><answer>Left || Up</answ"] * 5)
    out, _, dropped = with_copies([bad], "flip", renderer, RolloutConfig(), max_positions=4096)
    assert dropped == 0 and out[1].turns[0].penalty == bad.turns[0].penalty < 0
    assert not parse_response("<think>" + out[1].turns[0].response, 5).format_ok


def test_the_config_refuses_symmetry_where_it_cannot_hold():
    assert [grid_symmetric(t) for t in ("sokoban", "sokoban_vocab", "sokoban_large")] == [True] * 3
    assert not any(grid_symmetric(t) for t in ("frozen_lake", "bandit", "countdown", "no_such_env"))
    assert load_config(None, ["train.env=sokoban", "algo.symmetry=orbit"]).algo.symmetry == "orbit"
    with pytest.raises(ConfigError, match="frozen_lake has no grid whose mirror plays alike.*sokoban, sokoban_large"):
        load_config(None, ["train.env=frozen_lake", "algo.symmetry=mirror"])
    with pytest.raises(ConfigError, match="needs algo.old_logprobs=rescore"):
        load_config(None, ["train.env=sokoban", "algo.symmetry=flip", "algo.old_logprobs=sampler"])
    with pytest.raises(ConfigError, match="'mirrror' is not one of none, mirror, flip, rotate, orbit.*mirror"):
        load_config(None, ["train.env=sokoban", "algo.symmetry=mirrror"])


def test_a_step_trains_on_every_sampled_trajectory_and_its_copies(tokenizer):  # noqa: F811
    from ragen.policy import Policy
    from ragen.policy.model import build_tiny_model
    from ragen.train import Learner, collect, select, train_step

    cfg = load_config(None, ["train.env=sokoban", "train.groups=2", "train.group_size=3", "train.mini_batch_size=48",
                             "rollout.max_new_tokens=12", "rollout.max_turns=2", "filter.keep_ratio=1.0",
                             "algo.advantage=grpo", "algo.symmetry=orbit"])
    model = build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                             intermediate_size=64, max_positions=2048, seed=0).eval()
    learner = Learner(Policy(model, tokenizer), None, None, torch.optim.AdamW(model.parameters(), lr=1e-3), None)
    pool = [100, 101]
    sampled, _, _ = select(cfg, collect(cfg, learner.policy, pool, 0))  # what the step plays and keeps
    assert len(sampled) == 6 and {t.end_reason for t in sampled} <= {"turns", "budget", "terminated", "context"}
    metrics = train_step(cfg, learner, pool, 0)
    assert (metrics["symmetry/copies"], metrics["symmetry/dropped"]) == (42.0, 0.0)  # the sampled text replays
    assert metrics["timing/symmetry_s"] > 0 and metrics["rollout/success_rate"] == sum(t.success for t in sampled) / 6
    assert all(v == v for k, v in metrics.items() if k.startswith("actor/"))
