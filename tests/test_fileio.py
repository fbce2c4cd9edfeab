"""Atomic file writes and YAML reading."""

import pytest

from ragen.fileio import read_yaml, staged_file, write_text


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
