"""The `ragen` command: the library's commands (`envs`, `play`) plus the pipeline's, which run Prefect flows.

    ragen report [key=value ...] [--ablation SET]  the pipeline's report (stage report), or an ablation set's
    ragen ablate SET [--workers N] [--runner threads|dask|ray] [--address A] [--dry-run] [key=value ...]
    ragen nightly run [--spec bench/nightly.yaml] [key=value ...]    once; exit 1 on a regression
    ragen nightly serve [--spec ...] [--cron "0 3 * * *"]            the scheduled Prefect deployment
"""

from __future__ import annotations

import argparse
import sys

import flows  # noqa: F401  (keeps Prefect's state inside the project)
from flows.common import InUse, quiet_flow_failures, stage_input_errors
from flows.server import prefect_api
from ragen import cli as library_cli
from ragen.ablation import AblationError, expand_set, read_ablations, runner_spec
from ragen.baselines import NightlySpecError
from ragen.config import ConfigError, load_config
from ragen.fileio import StageFileError, read_json
from ragen.tracking import TrackingError


def build_parser() -> argparse.ArgumentParser:
    parser = library_cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    rep = sub.add_parser("report", help="write the pipeline's report (reports/pipeline/) or an ablation set's")
    rep.add_argument("overrides", nargs="*", help="key=value: the settings the pipeline's stages ran with, when "
                     "they ran by hand with overrides (not with --ablation)")
    rep.add_argument("--ablation", help="an ablation set already run with `ragen ablate SET`")
    rep.add_argument("--ablations", default="ablations.yaml")
    abl = sub.add_parser("ablate", help="run an ablation set of ablations.yaml, each variant a full RL pipeline")
    abl.add_argument("set", help="ablation set name (see ablations.yaml)")
    abl.add_argument("overrides", nargs="*", help="key=value for every variant, e.g. train.steps=10")
    abl.add_argument("--ablations", default="ablations.yaml")
    abl.add_argument("--workers", type=int, help="variants at a time (threads runner)")
    abl.add_argument("--runner", choices=["threads", "dask", "ray"], help="task runner (default: the file's)")
    abl.add_argument("--address", help="scheduler address of an existing Dask or Ray cluster")
    abl.add_argument("--dry-run", action="store_true", help="list the runs and their overrides, run nothing")
    night = sub.add_parser("nightly", help="the nightly benchmark matrix against its baselines")
    night.add_argument("action", choices=["run", "serve"],
                       help="run: the matrix once, now; serve: the Prefect deployment on the spec's schedule")
    night.add_argument("overrides", nargs="*", help="key=value for every matrix entry (run only)")
    night.add_argument("--spec", default="bench/nightly.yaml",
                       help="the matrix and its baselines (default: %(default)s)")
    night.add_argument("--cron", help="cron schedule for serve (default: the spec's)")
    return parser


def cmd_report(args: argparse.Namespace) -> int:
    if args.ablation is None:
        from flows.report import report

        load_config("params.yaml", args.overrides)  # a config it cannot take stops it before a flow starts
        with prefect_api():
            report(overrides=args.overrides)
        return 0
    if args.overrides:
        print(f"ragen report: --ablation takes no key=value ({' '.join(args.overrides)}): each run of the set "
              "carries its own settings", file=sys.stderr)
        return 2
    from pathlib import Path

    from flows.ablate import set_report

    ablation = expand_set(read_ablations(args.ablations), args.ablation)
    results = {}
    for run in ablation.runs:
        done = Path("ablations") / ablation.name / run.name / "done.json"
        if not done.exists():
            print(f"ragen report: {done} is missing; run `ragen ablate {ablation.name}` first", file=sys.stderr)
            return 2
        fix = f"delete it and run `ragen ablate {ablation.name}`"
        results[run.name] = read_json(done, "run record", fix)["results"]
    path, _ = set_report(ablation, Path("ablations"), results)
    print(f"report | {path}")
    return 0


def cmd_ablate(args: argparse.Namespace) -> int:
    data = read_ablations(args.ablations)
    ablation = expand_set(data, args.set, extra=args.overrides)
    spec = runner_spec(data, kind=args.runner, workers=args.workers, address=args.address)
    if args.dry_run:
        print(f"{ablation.name}: {ablation.description}\nrunner: {spec.kind}, workers {spec.workers or 'auto'}")
        for run in ablation.runs:
            print(f"  {run.name:<24} {' '.join(run.overrides)}")
        return 0
    from flows.ablate import run_ablation

    run_ablation(args.set, args.overrides, runner=args.runner, workers=args.workers, address=args.address,
                 ablations=args.ablations)
    return 0


def cmd_nightly(args: argparse.Namespace) -> int:
    from flows.nightly import RegressionError, check_matrix, nightly, serve

    if args.action == "serve":
        if args.overrides:
            print(f"ragen nightly: serve takes no key=value ({' '.join(args.overrides)}): the deployment runs the "
                  f"spec's matrix as written; put them in its entries ({args.spec})", file=sys.stderr)
            return 2
        serve(args.spec, args.cron)
        return 0
    check_matrix(args.spec, "params.yaml", args.overrides)  # before a flow starts
    try:
        with prefect_api():
            nightly(spec=args.spec, extra=args.overrides)
    except RegressionError as error:
        print(f"ragen nightly: regression against the baselines in {args.spec}:\n{error}", file=sys.stderr)
        return 1
    return 0


def model_input_error(error: BaseException) -> bool:
    """Whether `error` is a stage's refusal of its model input (a model path, `model.device`, a checkpoint: the rest of
    `stage_input_errors`), raised by a stage inside an ablation variant or a nightly entry: before, their traceback.
    Only where the model code is loaded, so that `ragen report` and `--dry-run` do not import transformers (4 s)."""
    return "ragen.policy.model" in sys.modules and isinstance(error, stage_input_errors())


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if rest:  # key=value after an option: argparse leaves them over
        if not hasattr(args, "overrides") or any("=" not in item for item in rest):
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        args.overrides = [*args.overrides, *rest]
    commands = {"report": cmd_report, "ablate": cmd_ablate, "nightly": cmd_nightly}
    if args.command not in commands:
        return library_cli.main(argv)
    errors = (AblationError, ConfigError, InUse, NightlySpecError, FileNotFoundError, StageFileError, TrackingError)
    try:
        with quiet_flow_failures(errors, also=model_input_error):  # Prefect's line for a failed flow run, no traceback
            return commands[args.command](args)
    except Exception as error:
        if not isinstance(error, errors) and not model_input_error(error):
            raise
        print(f"ragen {args.command}: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        kept = "; a rerun skips the variants that finished" if args.command == "ablate" else ""
        print(f"ragen {args.command}: interrupted{kept}", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
