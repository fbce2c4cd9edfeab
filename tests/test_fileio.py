"""Atomic file writes, and reading back YAML, JSON and parquet with errors that name the file and the fix."""

import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from ragen.fileio import (StageFileError, parquet_schema, read_json, read_parquet, read_yaml, staged_dir, staged_file,
                          write_text)

ROOT = Path(__file__).resolve().parents[1]
WRITES_AND_DIES = """
import os, signal, sys, time
from ragen.fileio import staged_dir, staged_file
with staged_dir(sys.argv[1] + "/model") as folder, staged_file(sys.argv[1] + "/curve.png", suffix=".png") as png:
    (folder / "weights.bin").write_bytes(b"x" * 4096)
    png.write_bytes(b"half a png")
    print("writing", flush=True)
    if sys.argv[2] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)  # as the kernel's out-of-memory killer ends it: no cleanup runs
    time.sleep(600)
"""


def test_staged_file_replaces_on_success_and_keeps_the_old_file_on_failure(tmp_path):
    dest = tmp_path / "out" / "a.txt"
    write_text(dest, "first")
    with pytest.raises(RuntimeError):
        with staged_file(dest) as tmp:
            tmp.write_text("half")
            raise RuntimeError("killed")
    assert dest.read_text() == "first" and [p.name for p in dest.parent.iterdir()] == ["a.txt"]
    with staged_file(dest, suffix=".png") as tmp:
        assert tmp.suffix == ".png" and tmp.parent == dest.parent
        tmp.write_text("second")
    assert dest.read_text() == "second"


def test_read_yaml_names_the_file(tmp_path):
    (tmp_path / "ok.yaml").write_text("a: [1, 2]\n")
    assert read_yaml(tmp_path / "ok.yaml", ValueError, "spec") == {"a": [1, 2]}
    with pytest.raises(ValueError, match="missing.yaml: no such spec"):
        read_yaml(tmp_path / "missing.yaml", ValueError, "spec")
    (tmp_path / "bad.yaml").write_text("a: [\n")
    with pytest.raises(ValueError, match="bad.yaml: not valid YAML"):
        read_yaml(tmp_path / "bad.yaml", ValueError, "spec")


def test_read_json_names_a_damaged_file_and_the_fix(tmp_path):
    (tmp_path / "ok.json").write_text('{"a": 1}')
    assert read_json(tmp_path / "ok.json") == {"a": 1}
    (tmp_path / "bad.json").write_text('{"a": 1')  # cut off mid-write by something other than our writers
    with pytest.raises(StageFileError, match=r"bad.json: this meta file is not valid JSON .*; delete it and run "
                                             r"`dvc repro` to rebuild it"):
        read_json(tmp_path / "bad.json", "meta file")


@pytest.fixture
def table(tmp_path):
    path = tmp_path / "t.parquet"
    pl.DataFrame({"seed": list(range(100)), "moves": [i % 7 for i in range(100)]}).write_parquet(path)
    return path


def test_read_parquet_reads_columns_and_names_each_bad_file(table, tmp_path):
    assert read_parquet(table, ["seed"])["seed"].to_list() == list(range(100))
    assert list(parquet_schema(table)) == ["seed", "moves"]
    with pytest.raises(FileNotFoundError, match=r"none.parquet is missing; run stage envgen first"):
        read_parquet(tmp_path / "none.parquet", missing_hint="run stage envgen first")
    # asked for a column it lacks: a file of another writer
    with pytest.raises(StageFileError, match=r"t.parquet: no column 'optimal_moves' \(it has seed, moves\); it was "
                                             r"written by other code .*dvc repro"):
        read_parquet(table, ["seed", "optimal_moves"])
    with pytest.raises(StageFileError, match=r"no column 'turns'"):
        read_parquet(table, required=["turns"])
    # not parquet at all, and a parquet file cut short (its footer gone)
    (tmp_path / "text.parquet").write_text("seed,moves\n1,2\n")
    whole = table.read_bytes()
    (tmp_path / "cut.parquet").write_bytes(whole[: len(whole) // 2])
    for name in ["text.parquet", "cut.parquet"]:
        with pytest.raises(StageFileError, match=rf"{name}: not a readable parquet file \(.+\); delete it and run "
                                                 r"`dvc repro` to rebuild it"):
            read_parquet(tmp_path / name)
        with pytest.raises(StageFileError, match=name):
            parquet_schema(tmp_path / name)


def test_a_writer_killed_outright_leaves_staging_that_the_next_write_removes(tmp_path):
    script = tmp_path / "writes_and_dies.py"
    script.write_text(WRITES_AND_DIES)
    out = tmp_path / "out"
    out.mkdir()
    (out / ".model.not-a-stamp.x").write_text("someone else's")  # hidden files that are no staging of ours stay
    (out / ".model.old").mkdir()  # the output a writer killed between staged_dir's two renames had moved aside

    def writer(how):
        return subprocess.Popen([sys.executable, str(script), str(out), how], cwd=ROOT, stdout=subprocess.PIPE,
                                text=True, env=os.environ | {"PYTHONPATH": str(ROOT)})

    alive = writer("live")
    try:
        assert alive.stdout.readline() == "writing\n"
        killed = writer("kill")
        assert killed.stdout.readline() == "writing\n" and killed.wait(timeout=60) == -9
        left = sorted(p.name for p in out.iterdir())
        assert len(left) == 6  # each writer's folder and png, and the two others
        with staged_dir(out / "model") as folder:
            (folder / "weights.bin").write_bytes(b"whole")
        after = sorted(p.name for p in out.iterdir())
        gone = [n for n in left if n == ".model.old" or (n.startswith(".model.") and f"-{killed.pid}-" in n)]
        assert len(gone) == 2 and after == sorted(set(left) - set(gone)) + ["model"]  # the new output supersedes .old
        with staged_file(out / "curve.png", suffix=".png") as png:
            png.write_bytes(b"a png")
        assert not [n for n in os.listdir(out) if f"-{killed.pid}-" in n]
        assert len([n for n in os.listdir(out) if f"-{alive.pid}-" in n]) == 2  # its process still writes
        assert {".model.not-a-stamp.x", "model", "curve.png"} <= set(os.listdir(out))
    finally:
        alive.kill()
        alive.wait()
