import json
import subprocess
import sys

import pytest

from ragen.fileio import StageFileError
from ragen.model_meta import read_meta, save_meta


def test_save_meta_replaces_the_folder_with_its_meta_alone(tmp_path):
    (tmp_path / "critic").mkdir()
    (tmp_path / "critic" / "model.safetensors").write_bytes(b"old weights")
    save_meta(tmp_path / "critic", {"critic": "none", "settings": {"filter": {"algo.advantage": "grpo"}}})
    assert [p.name for p in (tmp_path / "critic").iterdir()] == ["ragen_meta.json"]
    assert json.loads((tmp_path / "critic" / "ragen_meta.json").read_text())["critic"] == "none"
    assert read_meta(tmp_path / "critic") == {"critic": "none", "settings": {"filter": {"algo.advantage": "grpo"}}}
    assert [p.name for p in tmp_path.iterdir()] == ["critic"]  # no staging left behind


def test_read_meta_of_a_folder_without_one_is_empty_and_a_damaged_one_is_named(tmp_path):
    assert read_meta(tmp_path) == {}
    (tmp_path / "ragen_meta.json").write_text("[1, ")
    with pytest.raises(StageFileError, match=r"ragen_meta.json: this model meta file is not valid JSON"):
        read_meta(tmp_path)


def test_the_record_reads_without_torch_or_transformers():
    """Stage report and `ragen report` read a policy's record (flows.report.check_trained_with) without loading
    torch and transformers (seconds of start-up)."""
    code = "import sys, flows.report, ragen.model_meta; print(sorted({'torch', 'transformers'} & set(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
