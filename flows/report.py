"""Stage report: a markdown report of one pipeline run with its training curves (PNG), also logged to MLflow.

Reads the metrics the earlier stages wrote (base, rollout, filter, update's per-step csv, evaluate) and writes
reports/pipeline/: report.md, curves.png (val success, in-group reward std, entropy, grad norm) and one PNG per
curve, with the Echo Trap marker (ragen.report). Timings are left out so the report is the same on every rerun.
`ragen report --ablation SET` writes the report of an ablation set (flows/ablate.py).

Run: `python -m flows.report [key=value ...]` or `ragen report`.
"""

from __future__ import annotations

import math
from pathlib import Path

from prefect import flow

from flows.common import run_stage
from flows.lineage import OtherSettings, differences
from ragen.config import Config, load_config
from ragen.fileio import read_json, write_text
from ragen.model_meta import read_meta
from ragen.presets import describe_preset
from ragen.report import (MARKER_WINDOW, OTHER_VAL, STD_DROP, TEMPLATE_DROP, TEMPLATE_MI, Series, echo_trap,
                          fall_in_se, gap_text, markdown_table, other_val_envs, plot_curves, read_steps_csv,
                          template_collapse, to_series)
from ragen.tracking import MlflowTracker, preset_of


def _read(path: Path) -> dict:
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing; run the stage that writes it first (dvc repro)")
    return read_json(path, "metrics file")


def check_ran_with(cfg: Config, metrics_dir: Path) -> None:
    """Raise OtherSettings when the metrics are of another env or step count than the report's settings say (stages
    run by hand with overrides, then the report without them): its title, headline and curves would name the wrong
    run, or fail to find it."""
    train, evaluation = _read(metrics_dir / "train.json"), _read(metrics_dir / "eval.json")
    trained = [key.split("/")[1] for key in train if key.startswith("val/") and key.endswith("/success")]
    steps = train.get("train/steps")
    if trained and (trained[0] != cfg.train.env or steps != cfg.train.steps):
        raise OtherSettings(
            f"{metrics_dir / 'train.json'} is of {steps} steps on {trained[0]}, and this report's settings say "
            f"train.steps={cfg.train.steps} on train.env={cfg.train.env}: write it with the settings the stages ran "
            f"with (`ragen report train.env={trained[0]} train.steps={steps} ...`, every override they had), or run "
            "the stages with these first (`dvc repro`)")
    if cfg.train.env not in evaluation:
        raise OtherSettings(f"{metrics_dir / 'eval.json'} holds no evaluation of {cfg.train.env} (it has "
                            f"{', '.join(evaluation) or 'none'}); run stage evaluate with this report's settings first")


def check_trained_with(cfg: Config, policy_dir: str) -> None:
    """Raise OtherSettings when the policy's record (update's and the stages' before it) holds other settings than
    the report's: its title and text would describe another run. A policy without a record passes."""
    found = differences(policy_dir, read_meta(policy_dir).get("settings"), cfg)
    if found:
        said = "; ".join(f"{key}={value} (this report: {ours})"
                         for key, (value, ours) in {key: (value, ours) for _, key, value, ours in found}.items())
        raise OtherSettings(f"{policy_dir} was trained with other settings than this report's: {said}; write it with "
                            "the settings the stages ran with (`ragen report key=value ...`, every override they had), "
                            "or run the stages with these first (`dvc repro`)")


def pipeline_markdown(cfg: Config, metrics_dir: Path, series: Series, trap: dict, template: dict, figure: str) -> str:
    """report.md of one pipeline run: its stage metrics, the curves `figure` of `series` and their markers
    (`echo_trap`, `template_collapse`)."""
    base, rollout, filt = (_read(metrics_dir / f"{name}.json") for name in ("base", "rollout", "filter"))
    train, evaluation = _read(metrics_dir / "train.json"), _read(metrics_dir / "eval.json")
    env = cfg.train.env
    fall = fall_sentence(trap, cfg.train.eval_episodes)
    start = next((v for v in series.values["val_success"] if not math.isnan(v)), math.nan)
    final = train.get(f"val/{env}/success", math.nan)
    lines = [
        f"# RAGEN pipeline report: {env}, preset {describe_preset(cfg)}",
        "",
        f"Policy `{cfg.model.source}`, {cfg.train.steps} steps of {cfg.train.groups} groups x {cfg.train.group_size} "
        f"rollouts, filter keep_ratio {cfg.filter.keep_ratio} ({cfg.filter.mode}), advantage {cfg.algo.advantage}, "
        f"clip {cfg.algo.clip_eps_low} / {cfg.algo.clip_eps_high}, KL {cfg.algo.kl}, seed {cfg.train.seed}.",
        "",
        "## Result",
        "",
        headline(env, evaluation[env]["val"], cfg.eval.temperature),
        f"In-loop val ({cfg.train.eval_episodes} episodes every {cfg.train.eval_every} steps, the curve below): "
        f"{start:.3f} before RL -> {final:.3f} after {cfg.train.steps} steps{other_val_text(series)}.",
        "",
        markdown_table(["env", "split", "success", "± se", "base", "gap (paired)", "ceiling", "of ceiling", "return",
                        "format-valid", "episodes", "first-action entropy", "top first action"],
                       [(tag, split, r["success_rate"], r["success_se"], r.get("base_success_rate", math.nan),
                         gap_cell(r), r["success_ceiling"], f"{r['success_of_ceiling']:.1%}", r["return_mean"],
                         r["format_valid_rate"], r["episodes"], r.get("first_action_entropy", math.nan),
                         r.get("first_action_top_share", math.nan))
                        for tag, splits in evaluation.items() for split, r in splits.items()]),
        "",
        "## Training curves",
        "",
        f"![curves]({figure})",
        "",
        f"Echo Trap marker (in-group reward std below {STD_DROP:.0%} of its peak for good; means over "
        f"{MARKER_WINDOW} steps): "
        f"{'none' if trap['collapse_step'] is None else 'step ' + str(trap['collapse_step'])} -> "
        f"{trap['verdict']}.{fall}",
        "",
        f"Template marker (first-action entropy below {TEMPLATE_DROP:.0%} of its first value, with under "
        f"{TEMPLATE_MI} nats on the instance, for good; means over {MARKER_WINDOW} steps): "
        f"{'none' if template['collapse_step'] is None else 'step ' + str(template['collapse_step'])}. First action "
        f"at the rollout temperature: "
        f"entropy {template['entropy_first']:.3f} -> {template['entropy_last']:.3f} nats, information on the instance "
        f"{template['mi_first']:.3f} -> {template['mi_last']:.3f} nats. A marker means the policy opens the same way "
        "whatever it is shown: a collapse where the right opening depends on the instance (Sokoban), the solution "
        "where one action is best everywhere (the bandit).",
        "",
        "## Base policy (stage base, val split, rollout temperature)",
        "",
        markdown_table(["env", "format-valid", "success", "random-action success"],
                       [(tag, r["format_valid_rate"], r["success_rate"], r["random_success_rate"])
                        for tag, r in base.items()]),
        "",
        "## Base rollouts and filter (step 1 batch)",
        "",
        markdown_table(["metric", "value"], sorted({**rollout, **filt}.items())),
        "",
    ]
    return "\n".join(lines)


def other_val_text(series: Series) -> str:
    """The in-loop val of train.val_envs, first and last evaluation of each ('; on the other val envs
    (train.val_envs) frozen_lake 0.203 -> 0.219, ...'), or '' when the run validated on train.env alone."""
    parts = []
    for env in other_val_envs(series):
        known = [v for v in series.values[OTHER_VAL + env] if not math.isnan(v)]
        if known:
            parts.append(f"{env} {known[0]:.3f} -> {known[-1]:.3f}")
    return f"; on the other val envs (train.val_envs) {', '.join(parts)}" if parts else ""


def headline(env: str, val: dict, temperature: float) -> str:
    """The result in one sentence: stage evaluate's val success of the trained policy, against the base's on the same
    episodes when eval.json has it (eval.against_base)."""
    where = f"Val success of `{env}` at temperature {temperature} (stage evaluate, {val['episodes']} episodes)"
    if "success_gap" not in val:
        return f"{where}: **{val['success_rate']:.3f}** (eval.against_base was off: no base figure)."
    return (f"{where}: **{val['base_success_rate']:.3f} for the base policy -> {val['success_rate']:.3f} trained, gap "
            f"{gap_text(val['success_gap'], val['success_gap_se'])}**, paired over the same instances.")


def gap_cell(split: dict) -> str:
    """A table cell for a split's trained-minus-base gap ('+0.375 ± 0.031 (+12.1 SE)'), or '' without one."""
    return gap_text(split["success_gap"], split["success_gap_se"]) if "success_gap" in split else ""


def fall_sentence(trap: dict, episodes: int) -> str:
    """How far val success ended below its best, in standard errors (ragen.report.fall_in_se); '' without one."""
    best, last = trap.get("best_val_success", math.nan), trap.get("final_val_success", math.nan)
    z = fall_in_se(best, last, episodes)
    if math.isnan(z) or best <= last:
        return ""
    return (f" Val success ended {z:.1f} SE below its best ({best:.3f} -> {last:.3f}, {episodes} episodes an "
            "evaluation): a fall under 2 SE is within the noise of two evaluations, and the best of several reads "
            "high.")


@flow(name="report")
def report(params: str = "params.yaml", overrides: list[str] | None = None, metrics_dir: str = "metrics",
           out_dir: str = "reports/pipeline", policy_dir: str = "models/policy") -> str:
    """`policy_dir`: the policy the metrics are of, whose record of the settings it was trained with
    (flows.lineage) must be the report's."""
    cfg = load_config(params, overrides or [])
    metrics_path, out = Path(metrics_dir), Path(out_dir)
    check_ran_with(cfg, metrics_path)
    check_trained_with(cfg, policy_dir)
    series = to_series(cfg.train.env, read_steps_csv(metrics_path / "train_steps.csv"))
    trap, template = echo_trap(series), template_collapse(series)
    with MlflowTracker.for_stage(cfg, "report") as tracker:
        pngs = plot_curves([series], out, f"{cfg.train.env} | {preset_of(cfg)}")
        write_text(out / "report.md", pipeline_markdown(cfg, metrics_path, series, trap, template, pngs[0].name))
        step = template["collapse_step"]
        tracker.set_tags({"ragen.echo_trap": trap["verdict"],
                          "ragen.template_step": "none" if step is None else str(step)})
        for path in [out / "report.md", *pngs]:
            tracker.log_file(path, "report")
        print(f"report | {out / 'report.md'} | echo trap: {trap['verdict']}")
    return str(out / "report.md")


if __name__ == "__main__":
    run_stage(report)
