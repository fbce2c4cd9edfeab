"""A checkpoint's files as stage base records them, and each way they can change afterwards."""

import hashlib
import os
import shutil

import pytest

from ragen.policy.fingerprint import changes, digest, fingerprint


@pytest.fixture
def ckpt(tmp_path):
    """A checkpoint folder as a download or a trainer leaves it, files dated a while back: what loading reads, and
    beside it a README, a licence, remote code, a download tool's hidden metadata and an intermediate checkpoint in
    a subfolder, which loading does not read."""
    root = tmp_path / "ckpt"
    (root / ".cache/huggingface").mkdir(parents=True)
    (root / "checkpoint-500").mkdir()
    files = {"config.json": b'{"model_type": "qwen2"}', "model-00001-of-00002.safetensors": b"\x01" * 64,
             "model-00002-of-00002.safetensors": b"\x02" * 32, "tokenizer.json": b"{}", "merges.txt": b"a b\n",
             "chat_template.jinja": b"{{ messages }}", "README.md": b"# a model", "LICENSE": b"MIT",
             "modeling_custom.py": b"pass", ".cache/huggingface/model.safetensors.metadata": b"etag",
             "checkpoint-500/model.safetensors": b"\x04" * 64}
    for name, data in files.items():
        (root / name).write_bytes(data)
        os.utime(root / name, ns=(10**18, 10**18))
    return root


def test_fingerprint_records_what_loading_reads(ckpt):
    record = fingerprint(ckpt)
    assert sorted(record) == ["chat_template.jinja", "config.json", "merges.txt", "model-00001-of-00002.safetensors",
                              "model-00002-of-00002.safetensors", "tokenizer.json"]
    assert record["model-00002-of-00002.safetensors"] == {
        "bytes": 32, "mtime_ns": 10**18, "sha256": hashlib.sha256(b"\x02" * 32).hexdigest()}


def test_an_unchanged_checkpoint_has_no_changes_even_when_copied(ckpt, tmp_path):
    record = fingerprint(ckpt)
    assert changes(ckpt, record) == []
    for name in ("README.md", "LICENSE", "modeling_custom.py", ".cache/huggingface/model.safetensors.metadata",
                 "checkpoint-500/model.safetensors"):
        (ckpt / name).write_bytes(b"edited")  # not read by loading: not a change
    os.utime(ckpt / "config.json")  # touched: a new mtime, the same content
    assert changes(ckpt, record) == []
    copy = shutil.copytree(ckpt, tmp_path / "copy")  # new mtimes throughout, hashed
    assert changes(copy, record) == []


def test_each_kind_of_change_is_named(ckpt):
    record = fingerprint(ckpt)
    (ckpt / "model-00001-of-00002.safetensors").write_bytes(b"\x03" * 64)  # other weights of the same size
    (ckpt / "model-00002-of-00002.safetensors").write_bytes(b"\x02" * 33)
    (ckpt / "tokenizer.json").unlink()
    (ckpt / "generation_config.json").write_text("{}")
    assert changes(ckpt, record) == ["tokenizer.json is gone", "generation_config.json is new",
                                     "model-00001-of-00002.safetensors has other content",
                                     "model-00002-of-00002.safetensors has 33 bytes, not 32"]


def test_same_size_and_mtime_count_as_unchanged(ckpt):
    """The rule of make and rsync, which keeps a check to `stat` calls: content rewritten with its size and mtime
    kept is not seen."""
    record = fingerprint(ckpt)
    (ckpt / "config.json").write_bytes(b'{"model_type": "llama"}'[:23])
    os.utime(ckpt / "config.json", ns=(10**18, 10**18))
    assert changes(ckpt, record) == []
    os.utime(ckpt / "config.json", ns=(10**18, 10**18 + 1))
    assert changes(ckpt, record) == ["config.json has other content"]


def test_digest_follows_names_and_contents_not_dates(ckpt):
    record = fingerprint(ckpt)
    assert digest(record) == digest({name: dict(entry, mtime_ns=0) for name, entry in record.items()})
    (ckpt / "merges.txt").write_bytes(b"a c\n")
    edited = digest(fingerprint(ckpt))
    assert edited != digest(record)
    (ckpt / "merges.txt").rename(ckpt / "vocab.txt")  # the same content under another name
    assert digest(fingerprint(ckpt)) not in (edited, digest(record))
