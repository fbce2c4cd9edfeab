"""The contract every env keeps: Gymnasium signature, info keys, determinism, bad actions."""

import json
import os
import subprocess
import sys
import time

import pytest

from ragen.envs import ENVS, make_env

INFO_KEYS = {"action_is_valid", "action_is_effective", "success"}


def scripted_episode(tag: str, seed: int) -> list:
    """Reset, then take a fixed action sequence; everything observable goes in the transcript."""
    env = make_env(tag)
    obs, info = env.reset(seed=seed)
    transcript = [obs, info]
    names = env.action_names or ["1 + 2 + 3", "(1 + 2) * 3 - 4"]
    for i in range(12):
        obs, reward, terminated, truncated, info = env.step(names[(i * 7 + seed) % len(names)])
        transcript.append([obs, reward, terminated, truncated, info])
        if terminated or truncated:
            break
    return transcript


def test_unknown_tag_lists_the_known_tags():
    with pytest.raises(KeyError) as error:
        make_env("sokobn")
    for tag in ENVS:
        assert tag in str(error.value)


@pytest.mark.parametrize("tag", list(ENVS))
def test_reset_and_step_follow_gymnasium_signature(tag):
    env = make_env(tag)
    obs, info = env.reset(seed=3, options=None)
    assert isinstance(obs, str) and obs
    assert set(info) >= INFO_KEYS
    action = env.action_names[0] if env.action_names else "1 + 1"
    obs, reward, terminated, truncated, info = env.step(action)
    assert isinstance(obs, str) and isinstance(reward, float)
    assert isinstance(terminated, bool) and isinstance(truncated, bool)
    assert set(info) >= INFO_KEYS and info["action_is_valid"]
    assert env.render() == obs


@pytest.mark.parametrize("tag", list(ENVS))
def test_same_seed_same_episode_in_process(tag):
    assert scripted_episode(tag, 11) == scripted_episode(tag, 11)


@pytest.mark.parametrize("tag", ["sokoban", "frozen_lake", "countdown", "bandit"])
def test_different_seeds_give_different_instances(tag):
    starts = {make_env(tag).reset(seed=s)[0] for s in range(20)}
    assert len(starts) > 1


def test_same_seed_same_episode_across_processes():
    """Another interpreter with another hash seed replays identical transcripts (no salted hash())."""
    code = (
        "import json, sys\n"
        "sys.path.insert(0, 'tests/envs')\n"
        "from test_common import scripted_episode\n"
        "from ragen.envs import ENVS\n"
        "print(json.dumps({tag: [scripted_episode(tag, s) for s in (0, 5, 123)] for tag in ENVS}))\n"
    )
    here = {tag: [scripted_episode(tag, s) for s in (0, 5, 123)] for tag in ENVS}
    for hash_seed in ("1", "4242"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
        assert json.loads(out.stdout) == json.loads(json.dumps(here))


@pytest.mark.parametrize("tag", list(ENVS))
@pytest.mark.parametrize("action", ["", "   ", "Jump", "<answer>Up</answer>", "\x00\xff\u202e", "Up Up", 123, None])
def test_non_action_is_invalid_without_state_change(tag, action):
    env = make_env(tag)
    obs, _ = env.reset(seed=1)
    new_obs, reward, terminated, truncated, info = env.step(action)
    assert info == {"action_is_valid": False, "action_is_effective": False, "success": False}
    assert (new_obs, reward, terminated, truncated) == (obs, 0.0, False, False)
    assert env.num_steps == 0


@pytest.mark.parametrize("tag", list(ENVS))
def test_megabyte_action_is_rejected_in_milliseconds(tag):
    env = make_env(tag)
    obs, _ = env.reset(seed=2)
    for huge in ("Up" * 500_000, "(" * 1_000_000, "1+" * 500_000 + "1"):
        start = time.perf_counter()
        new_obs, reward, _, _, info = env.step(huge)
        elapsed = time.perf_counter() - start
        assert not info["action_is_valid"] and new_obs == obs and reward == 0.0
        assert elapsed < 0.05, f"{tag}: {elapsed * 1000:.1f} ms for a 1 MB action"


@pytest.mark.parametrize("tag", list(ENVS))
def test_step_after_the_end_asks_for_reset(tag):
    env = make_env(tag)
    with pytest.raises(RuntimeError, match="reset"):
        env.step("Up")


@pytest.mark.parametrize("seed", [-1, 1.5, "7", True])
def test_bad_seed_is_a_clear_error(seed):
    with pytest.raises(ValueError, match="seed"):
        make_env("sokoban").reset(seed=seed)


def test_unknown_reset_option_is_named():
    with pytest.raises(ValueError, match="layuot"):
        make_env("sokoban").reset(seed=0, options={"layuot": "x"})
