"""Trajectories <-> parquet (polars), one row per trajectory with its turns as a list of structs."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Sequence

import polars as pl

from ragen.fileio import REBUILD, StageFileError, parquet_schema, read_parquet, staged_file
from ragen.records import Trajectory, Turn

TRAJ_FIELDS = [f.name for f in dataclasses.fields(Trajectory)]
# fields added later carry a default, so files written before them still read
TRAJ_REQUIRED = [f.name for f in dataclasses.fields(Trajectory) if f.default is dataclasses.MISSING]
TURN_REQUIRED = [f.name for f in dataclasses.fields(Turn) if f.default is dataclasses.MISSING]


def to_frame(trajectories: Sequence[Trajectory]) -> pl.DataFrame:
    rows = []
    for traj in trajectories:
        row = {name: getattr(traj, name) for name in TRAJ_FIELDS if name != "turns"}
        row = {k: list(v) if isinstance(v, tuple) else v for k, v in row.items()}
        row["turns"] = [{k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(t).items()}
                        for t in traj.turns]
        row["traj_return"] = traj.traj_return
        rows.append(row)
    return pl.DataFrame(rows)


def from_frame(frame: pl.DataFrame) -> list[Trajectory]:
    out = []
    for row in frame.iter_rows(named=True):
        turns = tuple(Turn(**{k: tuple(v) if isinstance(v, list) else v for k, v in t.items()}) for t in row["turns"])
        fields = {k: tuple(row[k]) if isinstance(row[k], list) else row[k]
                  for k in TRAJ_FIELDS if k != "turns" and k in row}  # files from before a field keep its default
        out.append(Trajectory(turns=turns, **fields))
    return out


SETTINGS_KEY = "ragen.settings"  # the file's key-value metadata: what made it, as JSON


def write_trajectories(path: str | Path, trajectories: Sequence[Trajectory],
                       scores: Sequence[float] | None = None, settings: dict[str, Any] | None = None) -> None:
    """Atomic parquet write (temp file in the same folder, then rename); `scores` (one per trajectory, e.g. stage
    filter's normalised returns) go to a `score` column that `read_scores` returns, `settings` (the settings that
    made the file, e.g. flows.lineage's record) to its metadata, which `read_settings` returns."""
    frame = to_frame(trajectories)
    if scores is not None:
        if len(scores) != len(trajectories):
            raise ValueError(f"{len(scores)} scores for {len(trajectories)} trajectories")
        frame = frame.with_columns(pl.Series("score", [float(x) for x in scores], dtype=pl.Float64))
    metadata = {SETTINGS_KEY: json.dumps(settings, sort_keys=True)} if settings is not None else None
    with staged_file(path) as tmp:
        frame.write_parquet(tmp, metadata=metadata)


def read_trajectories(path: str | Path) -> list[Trajectory]:
    """The trajectories `write_trajectories` stored; FileNotFoundError or StageFileError naming the file and the fix
    when it is missing, unreadable, or not a trajectories file."""
    frame = read_parquet(path, required=TRAJ_REQUIRED)
    turn_type = frame.schema["turns"]
    turn_fields = ({f.name for f in turn_type.inner.fields}
                   if isinstance(turn_type, pl.List) and isinstance(turn_type.inner, pl.Struct) else set())
    absent = [name for name in TURN_REQUIRED if name not in turn_fields]
    if absent and len(frame):
        raise StageFileError(f"{path}: its turns lack {', '.join(absent)}; it is not a trajectories file of this "
                             f"version; {REBUILD}")
    return from_frame(frame)


def read_scores(path: str | Path) -> list[float] | None:
    """The `score` column `write_trajectories` stored, in row order; None for a file written without one."""
    if "score" not in parquet_schema(path):
        return None
    return read_parquet(path, columns=["score"])["score"].to_list()


def read_settings(path: str | Path) -> dict[str, Any] | None:
    """The settings `write_trajectories` stored with the file; None for a file written without them."""
    parquet_schema(path)  # a missing or damaged file: the error that names it
    stored = pl.read_parquet_metadata(path).get(SETTINGS_KEY)
    if stored is None:
        return None
    try:
        return json.loads(stored)
    except ValueError:
        raise StageFileError(f"{path}: its {SETTINGS_KEY} metadata is not JSON; {REBUILD}") from None


def sample_table(trajectories: Sequence[Trajectory], limit: int = 32) -> dict[str, list]:
    """The first `limit` trajectories as readable columns (an MLflow table artifact): one row per trajectory."""
    rows = list(trajectories)[:limit]
    return {
        "env": [t.tag for t in rows], "seed": [t.seed for t in rows], "group": [t.group_id for t in rows],
        "success": [t.success for t in rows], "return": [round(t.traj_return, 4) for t in rows],
        "turns": [len(t.turns) for t in rows], "end": [t.end_reason for t in rows],
        "actions": [" | ".join(" || ".join(turn.actions) or "-" for turn in t.turns) for t in rows],
        "first_state": [t.turns[0].state if t.turns else "" for t in rows],
        "responses": ["\n---\n".join(turn.response for turn in t.turns) for t in rows],
    }


def instance_success_rates(path: str | Path, tag: str, seeds: Sequence[int], *, samples: int | None = None
                           ) -> list[float]:
    """Each instance's success rate over its episodes in a trajectories file (e.g. stage evaluate's eval.parquet),
    in the order of `seeds`: s_i = (successes of seed i) / (episodes of seed i), for env `tag`.

    Raises ValueError when an instance has no episode there, the instances have different episode counts
    (evaluations of other eval.episodes or eval.samples), or, with `samples`, any other count than that one
    (an evaluation left from another eval.samples), naming the file."""
    table = read_parquet(path, columns=["tag", "seed", "success"]).filter(pl.col("tag") == tag)
    rates = table.group_by("seed").agg(pl.col("success").cast(pl.Float64).mean().alias("rate"),
                                       pl.len().alias("episodes"))
    found = dict(zip(rates["seed"].to_list(), zip(rates["rate"].to_list(), rates["episodes"].to_list())))
    missing = [seed for seed in seeds if seed not in found]
    if missing:
        raise ValueError(f"{path}: no {tag} episode of {len(missing)} of the {len(seeds)} instances asked for (first: "
                         f"{missing[:3]}); evaluate on them first, with at least as many eval.episodes")
    counts = {found[seed][1] for seed in seeds}
    if len(counts) > 1:
        raise ValueError(f"{path}: the {tag} instances were played {sorted(counts)} times each; evaluate again with "
                         "one eval.samples for all")
    if samples is not None and counts != {samples}:
        raise ValueError(f"{path}: the {tag} instances were played {counts.pop()} times each, not eval.samples="
                         f"{samples}; evaluate again with eval.samples={samples}")
    return [found[seed][0] for seed in seeds]
