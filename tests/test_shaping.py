"""Potential-based shaping from the solvers: hand-computed potentials, per-turn shaping in a rollout, batches."""

import polars as pl
import pytest
import torch

from ragen.batching import build_batch
from ragen.config import RolloutConfig
from ragen.envs import make_env
from ragen.envs.solvers import frozen_lake_turn_value
from ragen.policy.chat import ChatRenderer
from ragen.records import EpisodeSpec
from ragen.rollout import run_episodes
from ragen.shaping import make_potential, shapeable
from ragen.trajectory_io import read_trajectories, write_trajectories
from tests.test_rollout import play, scripted, tokenizer  # noqa: F401  (the module fixture)

CORRIDOR = "#######\n#O_X_P#\n#######"  # walk Left, then two pushes: 3 moves
LAKE = "P___\n_O__\n___O\nO__G"


def potential_of(tag, layout, actions_left=10, turns_left=5, coef=1.0):
    env = make_env(tag)
    env.reset(seed=0, options={"layout": layout})
    return make_potential("solver", coef, 5)(env, actions_left, turns_left)


@pytest.mark.parametrize("layout, phi", [
    (CORRIDOR, -3.0),
    ("#######\n#O_XP_#\n#######", -2.0),  # one walk done
    ("#######\n#OX__P#\n#######", -3.0),  # one push from home, but two walks to reach the box first
    ("#####\n#X_O#\n#P__#\n#####", -10.0),  # deadlock: the box in a corner, the cap (the action budget)
])
def test_sokoban_potential_is_minus_the_moves_left_by_hand(layout, phi):
    assert potential_of("sokoban", layout) == phi


def test_lake_potential_is_the_best_success_probability_with_the_budget_left():
    for actions, turns in [(10, 5), (3, 2), (1, 1)]:
        assert potential_of("frozen_lake", LAKE, actions, turns) == pytest.approx(
            frozen_lake_turn_value(LAKE, actions, turns, 5))
    assert potential_of("frozen_lake", LAKE, 0, 5) == 0.0  # no action left: the goal is out of reach
    assert potential_of("frozen_lake", "_G\nP_", 10, 5, coef=2.0) == pytest.approx(
        2.0 * frozen_lake_turn_value("_G\nP_", 10, 5, 5))


def test_which_envs_have_a_potential_and_clear_errors_otherwise():
    assert [shapeable(t) for t in ("sokoban", "sokoban_large", "sokoban_vocab", "frozen_lake")] == [True] * 4
    assert not any(shapeable(t) for t in ("bandit", "countdown", "no_such_env"))
    assert make_potential("none", 1.0, 5) is None
    with pytest.raises(ValueError, match="unknown algo.shaping 'oracle'"):
        make_potential("oracle", 1.0, 5)
    bandit = make_env("bandit")
    bandit.reset(seed=0)
    with pytest.raises(ValueError, match="env 'bandit' has no solver potential.*algo.shaping=none"):
        make_potential("solver", 1.0, 5)(bandit, 1, 1)


def shaped_play(tokenizer, responses, layout=CORRIDOR, coef=0.5):  # noqa: F811
    potential = make_potential("solver", coef, 5)
    spec = EpisodeSpec("sokoban", 0, layout=layout)
    renderer = ChatRenderer(tokenizer, "<think>")
    return run_episodes([spec], scripted(tokenizer, responses), renderer, RolloutConfig(), max_positions=4096,
                        potential=potential)[0]


def test_each_turn_is_paid_its_progress_and_the_episode_the_difference(tokenizer):  # noqa: F811
    responses = ["a</think><answer>Right</answer>",  # bump the wall: no progress, 3 moves left
                 "b</think><answer>Left</answer>",  # 2 left
                 "c</think><answer>Up || Left</answer>",  # Up bumps the wall, Left pushes: 1 left
                 "nothing parses",  # penalised, no progress
                 "d</think><answer>Left</answer>"]  # solved
    traj = shaped_play(tokenizer, responses)
    assert [t.shaping for t in traj.turns] == pytest.approx([0.0, 0.5, 0.5, 0.0, 0.5])
    assert traj.success and traj.shaping == pytest.approx(0.5 * 3)  # c * (Phi(solved) - Phi(start)) = c * (0 + 3)
    assert traj.traj_return == pytest.approx(traj.env_return + traj.penalty + 1.5)
    unshaped = play(tokenizer, responses, spec=EpisodeSpec("sokoban", 0, layout=CORRIDOR))
    assert unshaped.shaping == 0.0 and [t.shaping for t in unshaped.turns] == [0.0] * 5
    # the shaping is never shown: the conversation is token for token the unshaped one
    assert traj.token_ids == unshaped.token_ids and traj.env_return == unshaped.env_return


def test_a_push_into_a_deadlock_costs_the_rest_of_the_cap(tokenizer):  # noqa: F811
    layout = "######\n#____#\n#_XP_#\n#_O__#\n######"  # 3 moves (Up, Left, Down); Left now pins the box to the wall
    traj = shaped_play(tokenizer, ["a</think><answer>Left</answer>"] + ["no answer"] * 4, layout=layout, coef=1.0)
    assert [t.shaping for t in traj.turns] == pytest.approx([-10.0 + 3.0, 0.0, 0.0, 0.0, 0.0])


def test_turn_placement_puts_each_turns_shaping_at_its_end(tokenizer):  # noqa: F811
    traj = shaped_play(tokenizer, ["a</think><answer>Left</answer>", "b</think><answer>Right || Left</answer>",
                                   "c</think><answer>Left || Left</answer>"])
    batch = build_batch([traj], pad_id=tokenizer.pad_token_id, device=torch.device("cpu"), reward_placement="turn")
    offset = batch.input_ids.shape[1] - len(traj.token_ids)
    for turn, end in zip(traj.turns, traj.turn_ends):
        assert batch.token_rewards[0, offset + end].item() == pytest.approx(turn.reward + turn.penalty + turn.shaping)
    assert batch.token_rewards[0].sum().item() == pytest.approx(traj.traj_return)
    last = build_batch([traj], pad_id=tokenizer.pad_token_id, device=torch.device("cpu"))
    assert last.token_rewards[0, -1].item() == pytest.approx(traj.traj_return)


def test_shaping_round_trips_and_older_files_read_as_unshaped(tmp_path, tokenizer):  # noqa: F811
    traj = shaped_play(tokenizer, ["a</think><answer>Left || Left || Left</answer>"])
    write_trajectories(tmp_path / "new.parquet", [traj])
    again = read_trajectories(tmp_path / "new.parquet")[0]
    assert again == traj and again.shaping == pytest.approx(1.5)
    rows = pl.read_parquet(tmp_path / "new.parquet").drop("shaping").to_dicts()  # a file from before the field
    for row in rows:
        row["turns"] = [{k: v for k, v in turn.items() if k != "shaping"} for turn in row["turns"]]
    old = pl.DataFrame(rows)
    assert "shaping" not in old.columns and "shaping" not in str(old.schema["turns"])
    old.write_parquet(tmp_path / "old.parquet")
    read = read_trajectories(tmp_path / "old.parquet")[0]
    assert read.shaping == 0.0 and all(t.shaping == 0.0 for t in read.turns)
    assert read.traj_return == pytest.approx(traj.env_return + traj.penalty)
