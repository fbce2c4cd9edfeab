"""Sokoban: gym-sokoban's move and push rules, rewards, episode end, layouts and generation."""

import pytest

from ragen.envs import LayoutError, make_env
from ragen.envs.solvers import sokoban_min_moves
from ragen.envs.sokoban import MAX_STEPS


def load(layout: str, tag: str = "sokoban"):
    env = make_env(tag)
    env.reset(seed=0, options={"layout": layout})
    return env


# --- moves and pushes ---
def test_walk_into_free_cell():
    env = load("######\n#P_XO#\n######")
    obs, reward, terminated, truncated, info = env.step("Right")
    assert obs == "######\n#_PXO#\n######"
    assert reward == pytest.approx(-0.1)
    assert info == {"action_is_valid": True, "action_is_effective": True, "success": False}
    assert not terminated and not truncated


def test_walk_into_wall_costs_a_step_but_does_nothing():
    env = load("######\n#P_XO#\n######")
    obs, reward, _, _, info = env.step("Up")
    assert obs == "######\n#P_XO#\n######"
    assert reward == pytest.approx(-0.1)
    assert info["action_is_valid"] and not info["action_is_effective"]
    assert env.num_steps == 1


def test_push_box_onto_target_and_solve():
    env = load("######\n#PX_O#\n######")
    obs, reward, terminated, _, _ = env.step("Right")
    assert obs == "######\n#_PXO#\n######" and reward == pytest.approx(-0.1) and not terminated
    obs, reward, terminated, truncated, info = env.step("Right")
    # -0.1 step + 1 box on target + 10 solved
    assert obs == "######\n#__P√#\n######"
    assert reward == pytest.approx(10.9)
    assert terminated and not truncated and info["success"]


def test_push_box_off_target_is_penalised():
    # two boxes, one already on a target: pushing it off costs -0.1 - 1
    env = load("#######\n#P√__O#\n#X____#\n#######")
    obs, reward, terminated, _, info = env.step("Right")
    assert obs == "#######\n#_SX_O#\n#X____#\n#######"  # the player now stands on the target
    assert reward == pytest.approx(-1.1)
    assert not terminated and not info["success"]


def test_box_onto_target_without_solving_pays_one():
    # two boxes: the first on target pays 0.9, not 10.9
    env = load("#######\n#PXO__#\n#_X__O#\n#######")
    _, reward, terminated, _, _ = env.step("Right")
    assert reward == pytest.approx(0.9) and not terminated


@pytest.mark.parametrize(
    "layout",
    [
        "#####\n#PX##\n#####\n#O__#\n#####",  # box against a wall
        "######\n#PXXO#\n#__O_#\n######",  # box against another box
    ],
)
def test_box_cannot_be_pushed_into_wall_or_box(layout):
    env = load(layout)
    obs, reward, _, _, info = env.step("Right")
    assert obs == layout and reward == pytest.approx(-0.1)
    assert info["action_is_valid"] and not info["action_is_effective"]


def test_cannot_pull_a_box():
    env = load("######\n#OXP_#\n######")
    obs, _, _, _, _ = env.step("Right")
    assert obs == "######\n#OX_P#\n######"


def test_player_on_target_is_drawn_as_S_and_actions_are_case_insensitive():
    env = load("######\n#_PO_#\n#_X__#\n######")
    obs, *_ = env.step("  rIGHT ")
    assert obs.splitlines()[1] == "#__S_#"


def test_truncated_after_100_steps():
    env = load("######\n#P_XO#\n######")
    for i in range(MAX_STEPS - 1):
        _, _, terminated, truncated, _ = env.step("Up")
        assert not terminated and not truncated
    _, _, terminated, truncated, info = env.step("Up")
    assert truncated and not terminated and not info["success"]


# --- layouts ---
def test_render_round_trips_through_layout():
    env = make_env("sokoban")
    obs, _ = env.reset(seed=42)
    again = load(obs)
    assert again.render() == obs


@pytest.mark.parametrize(
    "layout, message",
    [
        ("#####\n#PZXO#\n#####", "row 2 has 6 columns but row 1 has 5"),
        ("######\n#PZXO#\n######", "unknown symbol 'Z' at row 2, column 3"),
        ("######\n#_XO_#\n######", "exactly one player"),
        ("######\n#PXPO#\n######", "exactly one player"),
        ("######\n#PX__#\n######", "1 boxes but 0 targets"),
        ("######\n#P√__#\n######", "already solved"),
        ("", "empty"),
    ],
)
def test_malformed_layout_names_the_problem(layout, message):
    with pytest.raises(LayoutError, match=message):
        load(layout)


def test_vocab_env_reads_and_writes_its_own_symbols():
    env = load("WWWWWW\nWAB.GW\nWWWWWW", tag="sokoban_vocab")
    with pytest.raises(LayoutError, match="unknown symbol '#'"):
        load("######\n#PX_O#\n######", tag="sokoban_vocab")
    obs, *_ = env.step("Right")
    assert obs == "WWWWWW\nW.ABGW\nWWWWWW"


def test_vocab_env_shows_the_same_rooms_as_sokoban_in_other_symbols():
    table = str.maketrans("#_O√XPS", "W.GCBA@")
    for seed in range(5):
        assert make_env("sokoban").reset(seed=seed)[0].translate(table) == make_env("sokoban_vocab").reset(seed=seed)[0]


# --- generation ---
@pytest.mark.parametrize("tag, side, boxes", [("sokoban", 6, 1), ("sokoban_large", 8, 2)])
def test_generated_rooms_are_solvable_unsolved_and_walled(tag, side, boxes):
    env = make_env(tag)
    for seed in range(40):
        obs, _ = env.reset(seed=seed)
        rows = obs.splitlines()
        assert len(rows) == side and all(len(r) == side for r in rows)
        assert rows[0] == "#" * side and rows[-1] == "#" * side
        assert all(r[0] == "#" and r[-1] == "#" for r in rows)
        assert obs.count("X") + obs.count("√") == boxes and obs.count("X") == boxes
        moves = sokoban_min_moves(obs)
        assert moves is not None and moves >= 1


def test_large_rooms_respect_reverse_search_depth():
    """Reverse play of depth 10 means a forward solution of at most 10 actions exists."""
    env = make_env("sokoban_large")
    for seed in range(30):
        obs, _ = env.reset(seed=seed)
        assert sokoban_min_moves(obs) <= 10
