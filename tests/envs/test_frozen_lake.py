"""FrozenLake: Gymnasium FrozenLake-v1 slip dynamics, rewards, episode end, layouts, generated maps."""

import pytest

from ragen.envs import LayoutError, make_env
from ragen.envs.frozen_lake import MAX_STEPS, has_path, parse_lake, transition_table

THIRD = 1.0 / 3.0


def load(layout: str, seed: int = 0):
    env = make_env("frozen_lake")
    env.reset(seed=seed, options={"layout": layout})
    return env


def outcome_probabilities(table, state, action):
    probs = {}
    for p, nxt, _, _ in table[state][action]:
        probs[nxt] = probs.get(nxt, 0.0) + p
    return probs


def test_transition_table_by_hand():
    # 3x3, player top-left (state 0), hole in the centre (4), goal bottom-right (8)
    lake, _ = parse_lake("P__\n_O_\n__G")
    table = transition_table(lake)
    # Left from the corner: intended Left hits the edge (stay), perpendicular Down -> 3, Up hits the edge (stay)
    assert outcome_probabilities(table, 0, 0) == pytest.approx({0: 2 * THIRD, 3: THIRD})
    # Right from 0: intended -> 1; perpendicular Down -> 3, Up -> stay
    assert outcome_probabilities(table, 0, 2) == pytest.approx({1: THIRD, 3: THIRD, 0: THIRD})
    # Down from 1 (top middle): intended -> 4 (hole, terminal), sideways Left -> 0, Right -> 2
    assert outcome_probabilities(table, 1, 1) == pytest.approx({4: THIRD, 0: THIRD, 2: THIRD})
    hole_entry = [e for e in table[1][1] if e[1] == 4][0]
    assert hole_entry[2] == 0.0 and hole_entry[3] is True
    # Right from 7 reaches the goal with reward 1 and terminates
    goal_entry = [e for e in table[7][2] if e[1] == 8][0]
    assert goal_entry == (THIRD, 8, 1.0, True)
    # terminal states are absorbing
    assert table[4][0] == [(1.0, 4, 0.0, True)] and table[8][3] == [(1.0, 8, 0.0, True)]


def test_slip_frequencies_match_the_table():
    """10,000 steps from the same tile: each outcome appears with probability 1/3 (within 4 sigma)."""
    layout = "___\n_P_\n__G"
    lake, player = parse_lake(layout)
    expected = outcome_probabilities(transition_table(lake), lake.index(player), 3)  # Up
    counts, n = {}, 10_000
    for seed in range(n):
        env = load(layout, seed=seed)
        env.step("Up")
        state = lake.index(env.player)
        counts[state] = counts.get(state, 0) + 1
    assert set(counts) == set(expected) == {1, 3, 5}  # up, left, right: never down
    for state, p in expected.items():
        sigma = (p * (1 - p) / n) ** 0.5
        assert abs(counts[state] / n - p) < 4 * sigma


def test_same_seed_same_slips():
    moves = ["Right", "Down", "Right", "Down", "Left", "Up"]
    runs = []
    for _ in range(2):
        env = load("P___\n____\n____\n___G", seed=9)
        runs.append([env.step(m)[0] for m in moves])
    assert runs[0] == runs[1]


def test_hole_terminates_without_success():
    # 1 x 3 corridor: every slip direction is blocked by the edge except the intended one... or staying
    env = load("PO_G")
    for seed in range(50):
        env = load("PO_G", seed=seed)
        obs, reward, terminated, truncated, info = env.step("Right")
        if terminated:
            assert obs == "_X_G" and reward == 0.0 and not info["success"]
            break
    else:
        pytest.fail("never fell into the hole in 50 seeds")


def test_goal_pays_one_and_terminates():
    for seed in range(50):
        env = load("PG", seed=seed)
        obs, reward, terminated, truncated, info = env.step("Right")
        if terminated:
            assert obs == "_√" and reward == 1.0 and info["success"] and info["action_is_effective"]
            break
        assert obs == "PG" and reward == 0.0 and not info["action_is_effective"]  # slipped into the edge
    else:
        pytest.fail("never reached the goal in 50 seeds")


def test_truncated_after_100_steps():
    env = load("P__\n___\n__G")
    steps = 0
    while True:
        _, _, terminated, truncated, _ = env.step("Left")  # Left/Up/Down from the left edge never reach G
        steps += 1
        if terminated or truncated:
            break
    assert truncated and not terminated and steps == MAX_STEPS


@pytest.mark.parametrize(
    "layout, message",
    [
        ("P_\n_Q", "unknown symbol 'Q' at row 2, column 2"),
        ("__\n_G", "exactly one player"),
        ("P_\n__", "exactly one goal"),
        ("PG\n___", "row 2 has 3 columns"),
        ("X_\n_G", "finished episode"),
    ],
)
def test_malformed_layout_names_the_problem(layout, message):
    with pytest.raises(LayoutError, match=message):
        load(layout)


def test_generated_maps_are_4x4_with_a_path():
    env = make_env("frozen_lake")
    holes = 0
    for seed in range(200):
        obs, _ = env.reset(seed=seed)
        rows = obs.splitlines()
        assert len(rows) == 4 and all(len(r) == 4 for r in rows)
        assert obs.count("P") == 1 and obs.count("G") == 1
        assert has_path(env.lake)
        holes += obs.count("O")
    # tiles are holes w.p. 0.2, but start and goal never are and maps without a path are redrawn
    assert 0.14 < holes / (200 * 14) < 0.23


def test_render_round_trips_through_layout():
    env = make_env("frozen_lake")
    obs, _ = env.reset(seed=77)
    assert load(obs).render() == obs
