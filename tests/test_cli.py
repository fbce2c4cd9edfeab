"""The `ragen` console script: `ragen envs`, `ragen play`."""

import shutil
import subprocess
import sys

from ragen.envs import ENVS


def ragen(*args, stdin=""):
    exe = shutil.which("ragen") or str(__import__("pathlib").Path(sys.executable).parent / "ragen")
    return subprocess.run([exe, *args], input=stdin, capture_output=True, text=True, timeout=60)


def test_envs_lists_every_tag_one_line_each():
    out = ragen("envs")
    assert out.returncode == 0
    lines = out.stdout.strip().splitlines()
    assert [line.split()[0] for line in lines] == list(ENVS)


def test_play_sokoban_to_the_end(tmp_path):
    layout = tmp_path / "room.txt"
    layout.write_text("######\n#PX_O#\n######\n")
    out = ragen("play", "sokoban", "--layout", str(layout), stdin="jump\nRight\nright\n")
    assert out.returncode == 0, out.stderr
    assert "not an action: 'jump'" in out.stdout
    assert "#__P√#" in out.stdout
    assert "episode terminated: success, 2 actions, return 10.8" in out.stdout


def test_play_stops_on_quit_and_end_of_input():
    out = ragen("play", "frozen_lake", "--seed", "4", stdin="Left\nquit\n")
    assert out.returncode == 0 and "stopped after" in out.stdout
    assert ragen("play", "bandit", stdin="").returncode == 0


def test_play_unknown_tag_and_bad_layout_are_clear_errors(tmp_path):
    out = ragen("play", "sokobn")
    assert out.returncode == 2 and "unknown env tag 'sokobn'" in out.stderr and "sokoban" in out.stderr
    bad = tmp_path / "bad.txt"
    bad.write_text("#####\n#P?X#\n")
    out = ragen("play", "sokoban", "--layout", str(bad))
    assert out.returncode == 2 and "row 2" in out.stderr
    # a layout file that is not there: one line, not an open() traceback
    missing = tmp_path / "none.txt"
    out = ragen("play", "sokoban", "--layout", str(missing))
    assert (out.returncode, out.stderr) == (2, f"ragen play: --layout {missing}: No such file or directory\n")
    (tmp_path / "binary.txt").write_bytes(b"\xff\xfe\x00")
    out = ragen("play", "sokoban", "--layout", str(tmp_path / "binary.txt"))
    assert out.returncode == 2 and "'utf-8' codec can't decode" in out.stderr and "Traceback" not in out.stderr
    # an env without layouts says so in the words of the command, not of the API (was "reset with options=None")
    out = ragen("play", "bandit", "--layout", str(bad))
    assert (out.returncode, out.stderr) == (2, "ragen play: bandit: the bandit takes no layout; its seed alone sets an "
                                               "episode (the arms' order and the payout draw)\n")
