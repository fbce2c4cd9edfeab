"""Reports: training curves as PNG (matplotlib) and a markdown summary, for one pipeline run or an ablation set.

A run's curves come from its per-step csv (stage update's metrics/train_steps.csv); several runs are drawn on the
same axes, so StarPO and StarPO-S (or any ablation's variants) compare side by side. Variants that differ only by
seed are averaged into one curve with a min-max band.

Echo Trap marker (RAGEN section 4): the step after which the in-group reward std stays below `STD_DROP` of its
peak, both as trailing means over `MARKER_WINDOW` steps (step 0, the stage-filter batch, left out): the rollouts of a
group have become alike. One batch's std is noisy where successes are rare (Sokoban's eight groups a step read 0.4 to
3.6 around a mean of 1.7), so a single step's peak and a run's last two low steps made a marker of noise. It is
called a trap when validation success ends clearly below its best (a collapse), and a convergence when success
stays at its best; a success collapse with the reward std kept is reported as such.

Template marker (ragen.diagnostics): the step after which the entropy of the episodes' first action stays below
`TEMPLATE_DROP` of its first value while that action carries less than `TEMPLATE_MI` nats about the instance, both
as means over the last `MARKER_WINDOW` steps (one batch's estimate is noisy): the policy has lost a quarter of its
opening's spread and gained nothing on the instance for it, so it opens the same way whatever it is shown. At the
rollout temperature 1 the fall is partial; at the evaluation's 0.5 the same policy opens with one action on nearly
every instance (bench/RESULTS.md, "Template collapse"). The reward std can stay up meanwhile, so the Echo Trap
marker misses it. Where one action is best everywhere (the bandit) this is the solution, not a failure.
"""

from __future__ import annotations

import csv
import itertools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from ragen.fileio import staged_file

CURVES = {  # csv column -> plot title: RAGEN's Echo Trap indicators (its Fig. 6), then the template's and repetition's
    "val_success": "val success",
    "rollout/return_mean": "mean training return",
    "rollout/in_group_std_mean": "in-group reward std",
    "actor/entropy": "entropy",
    "actor/grad_norm": "grad norm",
    "rollout/first_action_entropy": "first-action entropy (nats)",
    "rollout/first_action_mi": "first action's information on the instance (nats)",
    "rollout/response_distinct_in_group": "distinct first answers within a group",
}
OTHER_VAL = "val_success/"  # csv column prefix of the in-loop val success on train.val_envs, one per env
STD_DROP = 0.25
COLLAPSE_MARGIN = 0.1
COLLAPSE_SHARE = 0.5
TEMPLATE_DROP = 0.75
TEMPLATE_MI = 0.1
MARKER_WINDOW = 10


@dataclass(frozen=True)
class Series:
    """One curve per metric for one run (or the mean of several seeds: `lo`/`hi` hold the band)."""

    label: str
    steps: list[int]
    values: dict[str, list[float]]
    lo: dict[str, list[float]] | None = None
    hi: dict[str, list[float]] | None = None


def read_steps_csv(path: str | Path) -> list[dict[str, float]]:
    """The per-step csv of stage update -> rows of floats (empty cells are NaN)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing; run stage update first (dvc repro update)")
    with open(path, newline="") as handle:
        return [{k: float(v) if v not in ("", None) else math.nan for k, v in row.items()}
                for row in csv.DictReader(handle)]


def to_series(label: str, rows: Sequence[dict[str, float]]) -> Series:
    """The CURVES of a run's csv rows, and its `val_success/<env>` columns (train.val_envs) where it has them."""
    others = [k for k in (rows[0] if rows else {}) if k.startswith(OTHER_VAL)]
    return Series(label, [int(r["step"]) for r in rows],
                  {k: [r.get(k, math.nan) for r in rows] for k in [*CURVES, *others]})


def other_val_envs(series: Series) -> list[str]:
    """The envs besides train.env whose in-loop val success the series holds (train.val_envs), in csv order."""
    return [key[len(OTHER_VAL):] for key in series.values if key.startswith(OTHER_VAL)]


def mean_series(label: str, runs: Sequence[Series]) -> Series:
    """Mean over runs (seeds) per step, over the steps all runs have; band = min and max. The in-loop val of
    train.val_envs is averaged for the envs every run has it for."""
    if len(runs) == 1:
        return Series(label, runs[0].steps, runs[0].values)
    length = min(len(r.steps) for r in runs)
    values, lo, hi = {}, {}, {}
    shared = [OTHER_VAL + env for env in other_val_envs(runs[0]) if all(OTHER_VAL + env in r.values for r in runs)]
    for key in [*CURVES, *shared]:
        columns = list(zip(*(r.values[key][:length] for r in runs)))
        values[key] = [sum(c) / len(c) for c in columns]
        lo[key], hi[key] = [min(c) for c in columns], [max(c) for c in columns]
    return Series(label, runs[0].steps[:length], values, lo, hi)


def echo_trap(series: Series, window: int = MARKER_WINDOW) -> dict[str, float | int | str | None]:
    """The reward-std collapse step (or None), and whether success collapsed (trap) or held after it.

    The collapse step is the first after which the trailing mean of the in-group reward std over `window` steps
    stays below STD_DROP of that mean's peak (step 0 and steps without a figure left out). Success collapsed when
    the last val success is below the best by COLLAPSE_MARGIN, or by COLLAPSE_SHARE of the best where that is less:
    a Sokoban run whose val falls 0.11 -> 0.02 has collapsed though it lost under 0.1."""
    std, success = series.values["rollout/in_group_std_mean"], series.values["val_success"]
    known = [i for i in range(1, len(std)) if not math.isnan(std[i])]
    if not known:
        return {"collapse_step": None, "verdict": "no data"}
    smooth = trailing_means([std[i] for i in known], window)
    peak = max(smooth)
    start = first_for_good([peak > 0 and s < STD_DROP * peak for s in smooth])
    step = None if start is None else series.steps[known[start]]
    valid = [s for s in success if not math.isnan(s)]
    best, last = (max(valid), valid[-1]) if valid else (math.nan, math.nan)
    collapsed = last < best - min(COLLAPSE_MARGIN, COLLAPSE_SHARE * best)
    if step is None:
        verdict = "success collapsed (reward std kept)" if collapsed else "none"
    else:
        verdict = "echo trap (success collapsed)" if collapsed else "converged (success held)"
    return {"collapse_step": step, "verdict": verdict, "best_val_success": best, "final_val_success": last}


def fall_in_se(best: float, last: float, episodes: int) -> float:
    """How far success fell from its best, in standard errors of two independent evaluations of `episodes` each:

        z = (best - last) / sqrt(best (1 - best) / n + last (1 - last) / n)

    Conservative where both evaluations run the same instances (they share their easy ones), and flattering where
    `best` is the highest of several evaluations (a lucky high). NaN without episodes or a spread (both 0 or 1)."""
    variance = (best * (1 - best) + last * (1 - last)) / episodes if episodes > 0 else 0.0
    return (best - last) / math.sqrt(variance) if variance > 0 else math.nan


def gap_text(gap: float, se: float) -> str:
    """A success gap with its standard error and their ratio: '+0.375 ± 0.031 (+12.1 SE)' ('+0.000 ± 0.000' when
    the error is 0: identical per-instance results)."""
    return f"{gap:+.3f} ± {se:.3f}" + (f" ({gap / se:+.1f} SE)" if se > 0 else "")


def trailing_means(values: Sequence[float], window: int) -> list[float]:
    """m_i = mean(v_{i-window+1}, ..., v_i), over the values there are at the start."""
    return [sum(values[max(0, i - window + 1):i + 1]) / (i + 1 - max(0, i - window + 1)) for i in range(len(values))]


def first_for_good(holds: Sequence[bool]) -> int | None:
    """The first index from which every later one holds too (None when the last does not): where a marker's
    condition starts to hold for good."""
    start = None
    for i, held in enumerate(holds):
        start = (i if start is None else start) if held else None
    return start


def template_collapse(series: Series, window: int = MARKER_WINDOW) -> dict[str, float | int | None]:
    """The step after which the first action's entropy stays below TEMPLATE_DROP of its first value with its
    information on the instance below TEMPLATE_MI nats, both as trailing means over `window` steps (None if never),
    and both quantities at the first and last step (trailing means; steps without them, as in older csvs, skipped)."""
    entropy, mi = series.values["rollout/first_action_entropy"], series.values["rollout/first_action_mi"]
    known = [i for i, (h, m) in enumerate(zip(entropy, mi)) if not (math.isnan(h) or math.isnan(m))]
    if not known:
        return {"collapse_step": None, "entropy_first": math.nan, "entropy_last": math.nan,
                "mi_first": math.nan, "mi_last": math.nan}
    h = trailing_means([entropy[i] for i in known], window)
    m = trailing_means([mi[i] for i in known], window)
    start = first_for_good([hk < TEMPLATE_DROP * h[0] and mk < TEMPLATE_MI for hk, mk in zip(h, m)])
    step = None if start is None else series.steps[known[start]]
    return {"collapse_step": step, "entropy_first": h[0], "entropy_last": h[-1], "mi_first": m[0], "mi_last": m[-1]}


def plot_curves(series: Sequence[Series], out_dir: str | Path, title: str) -> list[Path]:
    """One PNG per metric (every series on the same axes) plus a 2x4 overview; returns the paths written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    overview, axes = plt.subplots(2, 4, figsize=(20, 7), constrained_layout=True)
    for (key, name), overview_ax in zip(CURVES.items(), axes.flat):
        figure, ax = plt.subplots(figsize=(6, 3.6), constrained_layout=True)
        for target in (ax, overview_ax):
            for s in series:
                line, = target.plot(s.steps, s.values[key], label=s.label, linewidth=1.6)
                if s.lo is not None:
                    target.fill_between(s.steps, s.lo[key], s.hi[key], color=line.get_color(), alpha=0.15)
                if key == "val_success":  # train.val_envs' curves on the same axes
                    dashes = itertools.cycle(("--", "-.", (0, (6, 2)), (0, (3, 1, 1, 1, 1, 1))))  # dotted: Echo Trap
                    for env, style in zip(other_val_envs(s), dashes):
                        target.plot(s.steps, s.values[OTHER_VAL + env], label=f"{s.label}: val on {env}",
                                    color=line.get_color(), linestyle=style, linewidth=1.2)
                marker = echo_trap(s)["collapse_step"]
                if marker is not None:
                    target.axvline(marker, color=line.get_color(), linestyle=":", linewidth=1)
            target.set_xlabel("step")
            target.set_title(name)
            target.grid(alpha=0.3)
        ax.legend(fontsize=8)
        path = out_dir / f"{key.replace('/', '_')}.png"
        _save(figure, path)
        plt.close(figure)
        written.append(path)
    axes.flat[0].legend(fontsize=8)
    overview.suptitle(title)
    path = out_dir / "curves.png"
    _save(overview, path)
    plt.close(overview)
    return [path] + written


def _save(figure, path: Path) -> None:
    with staged_file(path, suffix=".png") as tmp:
        figure.savefig(tmp, dpi=110)


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    def cell(value: object) -> str:
        if isinstance(value, float):
            return "-" if math.isnan(value) else f"{value:.3f}"
        return str(value)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)
