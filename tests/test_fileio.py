"""Atomic file writes, and reading back YAML, JSON and parquet with errors that name the file and the fix."""

import polars as pl
import pytest

from ragen.fileio import StageFileError, parquet_schema, read_json, read_parquet, read_yaml, staged_file, write_text


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
