"""What a local checkpoint's files were when stage base recorded it, and whether they are still that.

With `model.source: hf`, stage base records the checkpoint's path, not its weights, and DVC tracks `model.path` by
name. Overwriting the checkpoint in place (a new revision, a fine-tune saved over it) would leave every output up to
date in `dvc status`, and a stage that reruns (a changed knob) would then train or evaluate other weights than the
stages before it did. So base records each file that loading reads (size, mtime, sha256), and a stage that loads
the base through its record checks them first: a changed size, a new or missing file, or (where the mtime moved)
a changed sha256 is an error that names the files. Same size and mtime count as unchanged, as they do for make and
rsync, so that a check costs a few `stat` calls; a copy of the folder (new mtimes) is hashed once per load.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

# what `load_causal_lm` reads: config and generation config, safetensors shards and their index, tokenizer files
# (json, sentencepiece, tiktoken, merges / vocab text) and a chat template file; docs, licences and remote code not
LOADED_SUFFIXES = (".json", ".safetensors", ".jinja", ".model", ".txt", ".tiktoken")
CHUNK = 1 << 24  # bytes read at a time when hashing


def loaded_files(path: str | Path) -> list[Path]:
    """The files of `path` that loading reads, sorted. Only the folder's own: `from_pretrained` reads no subfolder,
    and a trainer's output folder keeps its intermediate `checkpoint-N/` there (Llama repos their `original/`)."""
    return sorted(p for p in Path(path).iterdir() if p.is_file() and p.suffix in LOADED_SUFFIXES)


def sha256(file: Path) -> str:
    digest = hashlib.sha256()
    with file.open("rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def fingerprint(path: str | Path) -> dict[str, dict[str, Any]]:
    """{file name: {"bytes", "mtime_ns", "sha256"}} for each file of `path` that loading reads."""
    record = {}
    for file in loaded_files(path):
        stat = file.stat()
        record[file.name] = {"bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": sha256(file)}
    return record


def digest(record: dict[str, dict[str, Any]]) -> str:
    """One sha256 for a whole fingerprint (names and contents), to tag a run with."""
    return hashlib.sha256("".join(f"{name}\0{entry['sha256']}\n" for name, entry in sorted(record.items()))
                          .encode()).hexdigest()


def changes(path: str | Path, record: dict[str, dict[str, Any]]) -> list[str]:
    """How the files of `path` differ from `record` (a `fingerprint`), one phrase each; [] when they do not."""
    now = {file.name: file for file in loaded_files(path)}
    found = [f"{name} is gone" for name in sorted(set(record) - set(now))]
    found += [f"{name} is new" for name in sorted(set(now) - set(record))]
    for name in sorted(set(record) & set(now)):
        was, stat = record[name], now[name].stat()
        if stat.st_size != was["bytes"]:
            found.append(f"{name} has {stat.st_size} bytes, not {was['bytes']}")
        elif stat.st_mtime_ns != was["mtime_ns"] and sha256(now[name]) != was["sha256"]:
            found.append(f"{name} has other content")
    return found
