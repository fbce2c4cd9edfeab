"""bench/entry.py: a benchmark ends a bad input in one line, exit code 2 (before: a traceback)."""

import subprocess
import sys
from pathlib import Path

import pytest

from benchload import load_bench
from ragen.config import ConfigError

ROOT = Path(__file__).resolve().parents[1]


def test_run_main_exits_with_mains_code_or_one_line_for_a_bad_input(capsys):
    entry = load_bench("entry")
    for returned, code in ((None, None), (3, 3)):
        with pytest.raises(SystemExit) as done:
            entry.run_main(lambda returned=returned: returned, "bench/bench_x.py")
        assert done.value.code == code

    def refused():
        raise ConfigError("train.steps must be >= 1, got 0")
    with pytest.raises(SystemExit) as done:
        entry.run_main(refused, "bench/bench_x.py")
    assert done.value.code == 2
    assert capsys.readouterr().err == "bench_x.py: train.steps must be >= 1, got 0\n"

    def bug():
        raise KeyError("a bug keeps its traceback")
    with pytest.raises(KeyError):
        entry.run_main(bug, "bench/bench_x.py")


def test_a_benchmark_with_a_bad_option_ends_in_one_line():
    done = subprocess.run([sys.executable, "bench/bench_base.py", "--episodes", "-3"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert (done.returncode, done.stderr) == (2, "bench_base.py: base.eval_episodes must be >= 1, got -3\n")


def test_every_benchmark_ends_through_the_entry():
    scripts = [path for path in (ROOT / "bench").glob("*.py") if path.name != "entry.py"]
    assert scripts and all(path.read_text().endswith("    run_main(main, __file__)\n") for path in scripts)
