"""All-or-nothing writes (a file or folder is built beside its destination and replaces it at once on success),
and reading the project's small YAML files with errors that name the file."""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator


@contextmanager
def staged_dir(dest: str | Path) -> Iterator[Path]:
    """Yield an empty folder beside `dest`; on success it replaces `dest` whole, on failure it is removed.

    So a writer that dies half-way leaves the previous output intact and never a half-written one.
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    staging.chmod(0o755)
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    old = None
    if dest.exists():
        old = dest.with_name(f".{dest.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(dest, old)
    os.replace(staging, dest)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


@contextmanager
def staged_file(dest: str | Path, suffix: str = "") -> Iterator[Path]:
    """Yield a temp path beside `dest` (ending in `suffix`, for writers that read the format from it); on success
    it replaces `dest`, on failure it is removed."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=suffix, dir=dest.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text(path: str | Path, text: str) -> None:
    """Atomic text write."""
    with staged_file(path) as tmp:
        tmp.write_text(text)


def read_yaml(path: str | Path, error: type[Exception], what: str) -> Any:
    """A YAML file as plain Python; `error` naming the file when it is missing ("no such {what}") or malformed."""
    from omegaconf import OmegaConf

    path = Path(path)
    if not path.exists():
        raise error(f"{path}: no such {what}")
    try:
        return OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    except Exception as error_:  # yaml syntax errors come in several types
        raise error(f"{path}: not valid YAML: {error_}") from None
