"""Ablation sets (ablations.yaml): named groups of variants, each variant a list of `key=value` overrides.

    echo_trap:
      description: vanilla StarPO against StarPO-S on one env over several seeds
      common: [train.env=bandit]          # overrides for every variant
      seeds: [0, 1, 2]                    # optional: every variant once per train.seed
      variants:
        starpo_grpo: [preset=starpo_grpo]
        starpo_s: [preset=starpo_s]

Every variant is checked against the config schema before anything runs (`expand_set` raises `AblationError`
naming the set, the variant and the knob). Variants share the pipeline's env tables and base policy (stages
envgen and base), so a variant may not change the sections those stages read (`envs`, `model`, `base`); such a
change is its own pipeline: `dvc exp run -S key=value`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from ragen.config import Config, ConfigError, did_you_mean, load_config
from ragen.fileio import read_yaml
from ragen.presets import expand_presets

SHARED_SECTIONS = ("envs", "model", "base")
SET_KEYS = ("description", "common", "seeds", "variants")
RUNNER_KINDS = ("threads", "dask", "ray")


class AblationError(ValueError):
    """A malformed ablation file or set, an unknown knob, or a knob the shared base policy fixes."""


@dataclass(frozen=True)
class AblationRun:
    """One pipeline run of a set: `variant` (the name in the file), the seed it runs with, its overrides."""

    name: str  # unique within the set, e.g. "starpo_s-s1"
    variant: str
    seed: int | None
    overrides: tuple[str, ...]


@dataclass(frozen=True)
class AblationSet:
    name: str
    description: str
    runs: tuple[AblationRun, ...]


@dataclass(frozen=True)
class RunnerSpec:
    """How variants run: `threads` (Prefect's thread pool, `workers` at a time) or an existing Dask / Ray
    cluster at `address` through prefect-dask / prefect-ray."""

    kind: str = "threads"
    workers: int = 0  # 0 = one variant per two CPU cores (at least one); one at a time on CUDA (`thread_workers`)
    address: str = ""


def thread_workers(workers: int, device: str, cpus: int) -> int:
    """How many variants the thread pool runs at once: `workers` when set (> 0). Otherwise one per two CPU cores (at
    least one) on the CPU, and one at a time when the models run on CUDA (`device`, the type `model.device`
    resolves to; a variant cannot change it, `model` being a shared section): every variant trains on the same
    device and holds its own actor, critic, gradients and AdamW state there (about 16 GB for Qwen2.5-0.5B's pair in
    float32), so the eight at once that a 16-core GPU machine's cores would allow run it out of memory."""
    if workers:
        return workers
    return 1 if device == "cuda" else max(1, cpus // 2)


def read_ablations(path: str | Path) -> dict[str, Any]:
    data = read_yaml(path, AblationError, "ablation file (run from the project root)")
    if not isinstance(data, dict):
        raise AblationError(f"{path}: expected a mapping of set names to sets")
    return data


def runner_spec(data: dict[str, Any], *, kind: str | None = None, workers: int | None = None,
                address: str | None = None) -> RunnerSpec:
    """The file's `runner:` section, with command-line values taking precedence."""
    section = data.get("runner") or {}
    unknown = set(section) - {"kind", "workers", "address"}
    if unknown:
        raise AblationError(f"runner: unknown key(s) {sorted(unknown)}; known: kind, workers, address")
    count = workers if workers is not None else section.get("workers", 0)
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise AblationError(f"runner.workers: {count!r} is not a whole number >= 0 (0: one variant per two CPU cores, "
                            "one at a time on a GPU)")
    spec = RunnerSpec(kind=kind or section.get("kind", "threads"), workers=count,
                      address=address if address is not None else str(section.get("address", "")))
    if spec.kind not in RUNNER_KINDS:
        raise AblationError(f"runner.kind: {spec.kind!r} is not one of {', '.join(RUNNER_KINDS)}")
    if spec.kind != "threads" and not spec.address:
        raise AblationError(f"runner.kind {spec.kind} needs runner.address (the scheduler of an existing cluster)")
    return spec


def set_names(data: dict[str, Any]) -> list[str]:
    return [name for name in data if name != "runner"]


def expand_set(data: dict[str, Any], name: str, *, params: str | Path | None = "params.yaml",
               extra: Sequence[str] = ()) -> AblationSet:
    """The runs of set `name`, every one validated against the config (an unknown knob fails here, naming it)."""
    if name not in set_names(data):
        raise AblationError(f"unknown ablation set {name!r}{did_you_mean(str(name), set_names(data))}; known sets: "
                            f"{', '.join(set_names(data))}")
    spec = data[name]
    unknown = sorted(set(spec) - set(SET_KEYS)) if isinstance(spec, dict) else []
    if unknown:  # first: `variant:` for `variants:` is named as the typo it is
        hint = did_you_mean(str(unknown[0]), SET_KEYS)
        raise AblationError(f"ablation set {name!r}: unknown key(s) {unknown}{hint}; known: {', '.join(SET_KEYS)}")
    if not isinstance(spec, dict) or not isinstance(spec.get("variants"), dict) or not spec["variants"]:
        raise AblationError(f"ablation set {name!r} needs a non-empty mapping 'variants: {{name: [key=value, ...]}}'")
    common = override_list(spec.get("common"), f"ablation set {name!r}: common")
    seeds = spec.get("seeds") or []
    if (not isinstance(seeds, list) or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds)
            or len(set(seeds)) != len(seeds)):
        raise AblationError(f"ablation set {name!r}: seeds {seeds!r} is not a list of distinct whole numbers >= 0, "
                            "as seeds: [0, 1, 2] (each variant runs once per train.seed)")
    runs = []
    for variant, overrides in spec["variants"].items():
        overrides = override_list(overrides, f"ablation set {name!r}, variant {variant!r}")
        for seed in seeds or [None]:
            items = [*common, *overrides, *([f"train.seed={seed}"] if seed is not None else []), *extra]
            check_overrides(name, variant, items, params)
            run_name = f"{variant}-s{seed}" if seed is not None else str(variant)
            runs.append(AblationRun(run_name, str(variant), seed, tuple(items)))
    return AblationSet(name, str(spec.get("description", "")), tuple(runs))


def override_list(value: Any, where: str) -> list[str]:
    """A set's `common` or a variant's overrides: a YAML list of key=value strings (or nothing)."""
    if value is None:
        return []
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return value
    raise AblationError(f"{where} is {value!r}; give the overrides as a list of key=value strings, as "
                        "[preset=starpo_s, train.env=sokoban]")


def check_overrides(set_name: str, variant: str, overrides: Sequence[str], params: str | Path | None) -> Config:
    where = f"ablation set {set_name!r}, variant {variant!r}"
    bad = [item for item in overrides if "=" not in item]
    if bad:
        raise AblationError(f"{where}: expected key=value overrides, got {bad}")
    try:
        keys = [item.split("=", 1)[0] for item in expand_presets(list(overrides))]
    except KeyError as error:
        raise AblationError(f"{where}: {error.args[0]}") from None
    shared = [key for key in keys if key.split(".", 1)[0] in SHARED_SECTIONS]
    if shared:
        raise AblationError(f"{where}: {shared} change the shared base policy or env tables (sections "
                            f"{', '.join(SHARED_SECTIONS)}); run such a change as its own pipeline: "
                            f"dvc exp run -S {shared[0]}=...")
    try:
        return load_config(params, overrides)
    except ConfigError as error:
        raise AblationError(f"{where}: {error}") from None
