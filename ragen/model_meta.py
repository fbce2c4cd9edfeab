"""The ragen meta of a model folder (`ragen_meta.json`): what built it (its source, an hf path, "no critic") and
the settings of the stages behind it. Plain JSON, so that readers of the record alone (stage report) need neither
torch nor transformers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ragen.fileio import read_json, staged_dir

META_FILE = "ragen_meta.json"


def save_meta(dest: str | Path, meta: dict[str, Any]) -> None:
    """A model folder with no weights, only its meta (an hf path record, or "no critic"), written all at once."""
    with staged_dir(dest) as staging:
        write_meta(staging, meta)


def write_meta(folder: Path, meta: dict[str, Any] | None) -> None:
    """The meta file into `folder`, a model folder being staged (`ragen.fileio.staged_dir`)."""
    (folder / META_FILE).write_text(json.dumps(meta or {}, indent=2, sort_keys=True) + "\n")


def read_meta(path: str | Path) -> dict[str, Any]:
    """The ragen meta of a model folder ({} when it has none); StageFileError naming the file when it is corrupt."""
    file = Path(path) / META_FILE
    return read_json(file, "model meta file") if file.exists() else {}
