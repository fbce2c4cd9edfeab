"""Nightly benchmark spec (bench/nightly.yaml) and regression checks against recorded baselines.

    schedule: "0 3 * * *"                      # cron, for `ragen nightly serve`
    matrix:                                    # entry -> overrides; each entry one RL pipeline run
      bandit_starpo_s: [train.env=bandit, preset=starpo_s, train.steps=20]
    baselines:                                 # "<entry>/<metric>" -> recorded value and the bounds it must keep
      bandit_starpo_s/val_success: {baseline: 0.98, min: 0.85}
      bandit_starpo_s/seconds_per_step: {baseline: 1.5, max: 4.0}

A metric below its `min` or above its `max`, or missing from the run, is a regression.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ragen.config import did_you_mean
from ragen.fileio import read_yaml


class NightlySpecError(ValueError):
    """A malformed bench/nightly.yaml."""


@dataclass(frozen=True)
class Bound:
    baseline: float
    min: float | None = None
    max: float | None = None


@dataclass(frozen=True)
class NightlySpec:
    schedule: str
    matrix: dict[str, list[str]]
    baselines: dict[str, Bound]


@dataclass(frozen=True)
class Regression:
    metric: str
    value: float
    bound: Bound

    def message(self) -> str:
        if math.isnan(self.value):
            return f"REGRESSION {self.metric}: missing from the run (baseline {self.bound.baseline:g})"
        limit = (f"below the minimum {self.bound.min:g}" if self.bound.min is not None and self.value < self.bound.min
                 else f"above the maximum {self.bound.max:g}")
        return f"REGRESSION {self.metric}: {self.value:.4g} is {limit} (baseline {self.bound.baseline:g})"


METRICS = ("val_success", "test_success", "val_gap", "seconds_per_step", "rollout_tokens_per_s")
"""What `ragen nightly run` measures of each entry (flows.nightly.entry_metrics), the `<metric>` of a baseline."""
KEYS = ("schedule", "matrix", "baselines")
BOUND_KEYS = ("baseline", "min", "max")


def read_nightly_spec(path: str | Path) -> NightlySpec:
    """The spec at `path`, checked whole before any run: a typo in a key or a metric would otherwise drop a
    baseline's check silently, or fail it as "missing from the run" after the whole matrix ran."""
    data = read_yaml(path, NightlySpecError, "nightly spec")
    if not isinstance(data, dict) or not isinstance(data.get("matrix"), dict) or not data["matrix"]:
        raise NightlySpecError(f"{path}: needs a non-empty 'matrix: {{entry: [key=value, ...]}}'")
    _known(path, "top-level key", data, KEYS)
    schedule = data.get("schedule", "0 3 * * *")
    if not isinstance(schedule, str):
        raise NightlySpecError(f"{path}: schedule {schedule!r} is not a cron string; quote it: schedule: \"0 3 * * *\"")
    matrix = {}
    for name, items in data["matrix"].items():
        if items is not None and not (isinstance(items, list) and all(isinstance(item, str) for item in items)):
            raise NightlySpecError(f"{path}: matrix entry {name!r} is {items!r}; give its overrides as a list of "
                                   f"key=value strings: {name}: [train.env=bandit, preset=starpo_s]")
        matrix[str(name)] = list(items or [])
    baselines = {}
    for metric, bound in (data.get("baselines") or {}).items():
        if isinstance(bound, dict):
            _known(path, f"key of baseline {metric!r}", bound, BOUND_KEYS)
        if not isinstance(bound, dict) or "baseline" not in bound or not ({"min", "max"} & set(bound)):
            raise NightlySpecError(f"{path}: baseline {metric!r} needs 'baseline' and at least one of 'min', 'max'")
        entry, _, measured = str(metric).partition("/")
        if entry not in matrix:
            raise NightlySpecError(f"{path}: baseline {metric!r} names no matrix entry (entries: {', '.join(matrix)})")
        if measured not in METRICS:
            raise NightlySpecError(f"{path}: baseline {metric!r}: the nightly measures no {measured!r}"
                                   f"{did_you_mean(measured, METRICS)}; each entry's figures: {', '.join(METRICS)}")
        try:
            baselines[metric] = Bound(float(bound["baseline"]), _opt(bound.get("min")), _opt(bound.get("max")))
        except (TypeError, ValueError):
            raise NightlySpecError(f"{path}: baseline {metric!r}: {bound} holds a value that is not a number") from None
    return NightlySpec(schedule, matrix, baselines)


def _known(path: str | Path, what: str, data: dict, known: tuple[str, ...]) -> None:
    for key in data:
        if key not in known:
            raise NightlySpecError(f"{path}: unknown {what} {key!r}{did_you_mean(str(key), known)}; known: "
                                   f"{', '.join(known)}")


def _opt(value: Any) -> float | None:
    return None if value is None else float(value)


def check_baselines(metrics: dict[str, float], baselines: dict[str, Bound]) -> list[Regression]:
    """Every metric outside its bounds (or missing: NaN) as a Regression, in the spec's order."""
    out = []
    for metric, bound in baselines.items():
        value = float(metrics.get(metric, math.nan))
        low = bound.min is not None and value < bound.min
        high = bound.max is not None and value > bound.max
        if math.isnan(value) or low or high:
            out.append(Regression(metric, value, bound))
    return out
