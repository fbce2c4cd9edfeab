"""All-or-nothing writes (a file or folder is built beside its destination and replaces it at once on success),
and reading back what the project wrote (YAML, JSON, parquet) with errors that name the file and the fix."""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Sequence

from ragen.liveness import process_stamp, stamp_has_ended

REBUILD = "delete it and run `dvc repro` to rebuild it"


class StageFileError(ValueError):
    """A file a stage wrote that cannot be read back (corrupt, truncated, or of another format or schema)."""


def staging_prefix(dest: Path) -> str:
    """The name of a staging file or folder for `dest`, up to its random part: ".<name>.<process stamp>.", so that
    a later write can tell the staging left by a process killed outright (signal 9 runs no cleanup) and remove it."""
    return f".{dest.name}.{process_stamp()}."


def clear_ended_staging(dest: Path) -> list[Path]:
    """Remove the staging files and folders beside `dest` whose process has ended (`ragen.liveness`): a model or a
    checkpoint half-written by a writer the kernel killed, which would otherwise stay there, hidden, for ever."""
    cleared = []
    head = f".{dest.name}."
    for entry in dest.parent.iterdir() if dest.parent.is_dir() else []:
        stamp = entry.name[len(head):].split(".", 1)  # <stamp>.<random part><suffix>
        if entry.name.startswith(head) and len(stamp) == 2 and stamp_has_ended(stamp[0]):
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
            cleared.append(entry)
    return cleared


@contextmanager
def staged_dir(dest: str | Path) -> Iterator[Path]:
    """Yield an empty folder beside `dest`; on success it replaces `dest` whole, on failure it is removed.

    So a writer that dies half-way leaves the previous output intact and never a half-written one. A writer killed
    outright cannot remove its folder; the next write of `dest` does (`clear_ended_staging`).
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    clear_ended_staging(dest)
    staging = Path(tempfile.mkdtemp(prefix=staging_prefix(dest), dir=dest.parent))
    staging.chmod(0o755)
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    old = dest.with_name(f".{dest.name}.old")
    shutil.rmtree(old, ignore_errors=True)  # also one left by a writer killed between the two renames
    if dest.exists():
        os.replace(dest, old)
    os.replace(staging, dest)
    shutil.rmtree(old, ignore_errors=True)


@contextmanager
def staged_file(dest: str | Path, suffix: str = "") -> Iterator[Path]:
    """Yield a temp path beside `dest` (ending in `suffix`, for writers that read the format from it); on success
    it replaces `dest`, on failure it is removed."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    clear_ended_staging(dest)
    fd, tmp = tempfile.mkstemp(prefix=staging_prefix(dest), suffix=suffix, dir=dest.parent)
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


def read_json(path: str | Path, what: str = "file", fix: str = REBUILD) -> Any:
    """A JSON file a stage wrote; StageFileError naming it, the cause and `fix` when it is not valid JSON."""
    import json

    path = Path(path)
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise StageFileError(f"{path}: this {what} is not valid JSON ({error}); {fix}") from None


def parquet_schema(path: str | Path, *, missing_hint: str = "run the stage that writes it first (dvc repro)"
                   ) -> dict[str, Any]:
    """Column name -> polars dtype of a parquet file a stage wrote, read from its footer alone.

    Raises:
        FileNotFoundError: no file at `path` (the message ends with `missing_hint`).
        StageFileError: not a readable parquet file (corrupt, truncated, another format), naming the file and the fix.
    """
    import polars as pl

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing; {missing_hint}")
    try:
        return dict(pl.read_parquet_schema(path))
    except (pl.exceptions.PolarsError, OSError) as error:
        raise StageFileError(f"{path}: not a readable parquet file ({error}); {REBUILD}") from None


def read_parquet(path: str | Path, columns: Sequence[str] | None = None, *, required: Sequence[str] = (),
                 missing_hint: str = "run the stage that writes it first (dvc repro)"):
    """A parquet file a stage wrote, as a polars DataFrame (only `columns` when given).

    Raises:
        FileNotFoundError: no file at `path` (the message ends with `missing_hint`).
        StageFileError: the file is not readable parquet (corrupt, truncated, another format), or it lacks a column
            of `columns` or `required` (written by other code); the message names the file, the cause and the fix.
    """
    import polars as pl

    schema = parquet_schema(path, missing_hint=missing_hint)
    absent = [name for name in dict.fromkeys([*(columns or []), *required]) if name not in schema]
    if absent:
        raise StageFileError(f"{path}: no column {', '.join(repr(n) for n in absent)} (it has {', '.join(schema)}); "
                             f"it was written by other code or for another purpose; {REBUILD}")
    try:
        return pl.read_parquet(path, columns=list(columns) if columns is not None else None)
    except (pl.exceptions.PolarsError, OSError) as error:  # a sound footer over damaged pages
        raise StageFileError(f"{path}: not a readable parquet file ({error}); {REBUILD}") from None
