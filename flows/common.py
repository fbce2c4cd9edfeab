"""What every stage flow shares: command-line overrides, all-or-nothing writes, and the digests of files and source
code that tell whether something recorded (a finished ablation run, a checkpoint) was made from the same inputs."""

from __future__ import annotations

import contextlib
import contextvars
import fcntl
import hashlib
import json
import logging
import os
import signal
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any, Callable, Iterator

from ragen.fileio import staged_dir, write_text  # noqa: F401  (staged_dir re-exported for the flows)


def cli_overrides(argv: list[str] | None = None) -> list[str]:
    """`python -m flows.x key=value ...` -> dotlist overrides for `load_config`; a ConfigError naming any other
    argument."""
    from ragen.config import ConfigError

    args = sys.argv[1:] if argv is None else argv
    bad = [arg for arg in args if "=" not in arg]
    if bad:
        raise ConfigError(f"expected key=value overrides (e.g. train.steps=3), got {bad}; --help says what the "
                          "stage does")
    return list(args)


def stage_usage(stage_flow: Any) -> str:
    """What `python -m flows.<stage> --help` prints: the command, the stage's summary (its module's first paragraph)
    and what key=value does."""
    module = sys.modules.get(getattr(stage_flow.fn, "__module__", ""))
    summary = ((module.__doc__ if module else None) or "").strip().split("\n\n")[0]
    name = stage_flow.name
    return "\n\n".join(textwrap.fill(part, 100) for part in [
        f"usage: python -m flows.{name} [key=value ...]", summary,
        "key=value sets a params.yaml key for this run (e.g. train.steps=3 preset=starpo_grpo; ragen/config.py "
        f"documents every key). dvc.yaml runs the stage as `python -m flows.run {name}`; `dvc repro` runs the "
        "pipeline, `dvc exp run -S key=value` with a setting."] if part)


def stage_input_errors() -> tuple[type[BaseException], ...]:
    """What a stage raises for an input it cannot take (a config, a file, a checkpoint, a model path, a tracking
    store, its lock held), each naming the problem and the fix: `run_stage` ends on them in one line, as the
    benchmarks do (bench/entry.py). Imports the model code (transformers) when called."""
    from ragen.checkpoint import CheckpointError
    from ragen.config import ConfigError
    from ragen.fileio import StageFileError
    from ragen.policy.model import ModelLoadError
    from ragen.tracking import TrackingError

    return (ConfigError, StageFileError, CheckpointError, ModelLoadError, FileNotFoundError, InUse, TrackingError)


def run_stage(stage_flow: Callable[..., Any]) -> Any:
    """`python -m flows.<stage> key=value ...` (what dvc.yaml runs): the flow with the command line's overrides.

    A config the stage cannot take (an unknown key, a bad value, no params.yaml) stops it before the flow starts,
    and an input it cannot read (missing, damaged, a checkpoint it cannot restore, a model path it cannot use)
    after Prefect has logged the flow run's failure (its one line, without the traceback: `QuietInputErrors`);
    either way the last line on stderr is "<stage>: <what is wrong and the fix>", exit code 2, instead of a Python
    traceback. Running out of memory ends the same way, with the amount asked for, the place in the project's code
    and the settings that bound what the stage holds at once (`flows.memory`). A bug still fails with its whole
    traceback. Without Prefect's flow heartbeat thread: joining it costs ~1 s per flow run, and a DVC stage's
    process is supervised by DVC, not by Prefect's crashed-run detection (served deployments keep their heartbeats).
    Ctrl-C, SIGTERM or SIGHUP end the stage through its cleanups (`ending_on_termination`), with exit code 130, 143
    or 129. Run directly (not under `make run`), the stage reports to a local Prefect server of its own
    (`flows.server.prefect_api`).

    While it runs, the stage holds its lock (`stage_lock`): the same stage started beside it (another terminal, or
    `dvc repro` beside a direct run) ends at once with exit code 2, naming this run's process, instead of writing
    the same outputs and resuming from the same checkpoint at once. DVC's own lock covers only `dvc` commands.
    """
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    from flows.memory import is_out_of_memory, out_of_memory_message
    from flows.server import prefect_api
    from ragen.config import load_config

    input_errors = stage_input_errors()
    if any(arg in ("-h", "--help") for arg in sys.argv[1:]):
        print(stage_usage(stage_flow))
        raise SystemExit(0)
    try:
        overrides = cli_overrides()
        cfg = load_config("params.yaml", overrides)
        with quiet_flow_failures(input_errors, also=is_out_of_memory), \
                exclusively(stage_lock(stage_flow.name), f"stage {stage_flow.name}"), ending_on_termination(), \
                prefect_api(), temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
            return stage_flow(overrides=overrides)
    except input_errors as error:
        print(f"{stage_flow.name}: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    except RuntimeError as error:  # torch.OutOfMemoryError is one
        if not is_out_of_memory(error):
            raise
        print(f"{stage_flow.name}: {out_of_memory_message(stage_flow.name, error, cfg, SOURCE_ROOT)}", file=sys.stderr)
        raise SystemExit(2) from None
    except KeyboardInterrupt:
        print(f"{stage_flow.name}: interrupted; nothing half-written is left, run it again", file=sys.stderr)
        raise SystemExit(130) from None


def stage_lock(name: str) -> Path:
    """The lock file a running stage holds (`run_stage`), in the project's git-ignored scratch folder."""
    return Path(".tmp") / "locks" / f"{name}.lock"


TERMINATION = (signal.SIGTERM, signal.SIGHUP)  # `kill`, a batch system's time limit, a closed terminal


@contextlib.contextmanager
def handling_signals(signals: tuple[int, ...], handler: Any) -> Iterator[None]:
    """Within the block, `handler` (a function or signal.SIG_IGN) for each of `signals`; their previous handlers
    after it."""
    previous = {signum: signal.signal(signum, handler) for signum in signals}
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


def interruption(signum: int, signals: tuple[int, ...]) -> BaseException:
    """What signal `signum` ends a block with, as a shell reports it: KeyboardInterrupt for SIGINT, SystemExit(128 +
    N) otherwise. `signals` are ignored from here on, so that a second one does not cut the cleanups short."""
    for other in signals:
        signal.signal(other, signal.SIG_IGN)
    return KeyboardInterrupt() if signum == signal.SIGINT else SystemExit(128 + signum)


@contextlib.contextmanager
def ending_on_termination() -> Iterator[None]:
    """Within the block, SIGTERM or SIGHUP raises SystemExit(128 + N), so the block's cleanups run and the exit code
    is a shell's: `make run`'s wrapper ends its command and servers (flows/server.py), a stage marks its MLflow run
    KILLED and Prefect its flow run crashed, and a half-written output's staging folder is removed. A second signal
    while they run is ignored."""
    def end(signum: int, _frame: object) -> None:
        raise interruption(signum, TERMINATION)

    with handling_signals(TERMINATION, end):
        yield


STOP = threading.Event()  # set when the process is asked to stop: work on other threads ends at its next step
STOP_FILE: contextvars.ContextVar[Path | None] = contextvars.ContextVar("ragen_stop_file", default=None)


class Interrupted(BaseException):
    """Raised at the next step of work that was asked to stop (`check_stop`), on a worker thread or in a worker
    process (an ablation variant): an interruption, not an error, so its cleanups run and its MLflow run reads
    KILLED."""


def check_stop() -> None:
    """Raise `Interrupted` once this process has been asked to stop (`STOP`), or once the stop file of the work
    on this thread exists (`watching`): its driver, another process, was asked to stop. Called between the steps
    of long work."""
    stop_file = STOP_FILE.get()
    if STOP.is_set() or (stop_file is not None and stop_file.exists()):
        raise Interrupted("the process was asked to stop")


@contextlib.contextmanager
def watching(stop_file: Path) -> Iterator[None]:
    """Within the block, `check_stop` on this thread also stops once `stop_file` exists: how work that runs in
    another process than its driver (an ablation variant in a Dask or Ray worker, which shares the project's
    folder) learns that the driver was stopped."""
    token = STOP_FILE.set(stop_file)
    try:
        yield
    finally:
        STOP_FILE.reset(token)


@contextlib.contextmanager
def stopping_threads(stop_file: Path | None = None) -> Iterator[None]:
    """Within the block, on the main thread of a flow whose tasks run on threads or in other processes: Ctrl-C,
    SIGTERM or SIGHUP set `STOP` and create `stop_file` (if given), so the tasks end at their next step
    (`check_stop`, `watching`) through their cleanups, and end the block (`interruption`). Prefect's own SIGTERM
    handler is set aside meanwhile: it raised at once, and then the flow waited for its threads to finish all their
    work (a whole ablation variant); a Dask cluster ran its tasks to their end after the flow had gone. A second
    signal is ignored. Off the main thread the block changes nothing."""
    signals = (signal.SIGINT, *TERMINATION)

    def stop(signum: int, _frame: object) -> None:
        STOP.set()
        if stop_file is not None:
            stop_file.parent.mkdir(parents=True, exist_ok=True)
            stop_file.touch()
        print("stopping: work running on other threads or processes ends at its next step", file=sys.stderr,
              flush=True)
        raise interruption(signum, signals)

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    STOP.clear()
    with handling_signals(signals, stop):
        yield


class InUse(RuntimeError):
    """Another process holds the lock on what this one would write (`exclusively`)."""


@contextlib.contextmanager
def exclusively(lock: Path, what: str) -> Iterator[None]:
    """Hold an exclusive lock on the file `lock` (created if missing) within the block; while another process holds
    it, raise `InUse` at once, naming `what` and the holder's process id. The kernel drops the lock when its
    process ends, however it ends (flock), so a killed run leaves no stale lock behind."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a+", encoding="utf-8") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            raise InUse(f"{what} is in use by another run (process {holder}); wait for it to end, or stop it "
                        f"(`kill {holder}`)") from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class QuietInputErrors(logging.Filter):
    """Drops the traceback from a log record of one of `errors`, or of an error `also` says yes to (Prefect logs a
    failed flow run's exception with its traceback): the record's own line, which names the error, stays. Other
    exceptions keep their tracebacks."""

    def __init__(self, errors: tuple[type[BaseException], ...],
                 also: Callable[[BaseException], bool] | None = None) -> None:
        super().__init__()
        self.errors, self.also = errors, also

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if error is not None and (isinstance(error, self.errors) or (self.also is not None and self.also(error))):
            record.exc_info, record.exc_text = None, None
        return True


@contextlib.contextmanager
def quiet_flow_failures(errors: tuple[type[BaseException], ...],
                        also: Callable[[BaseException], bool] | None = None) -> Iterator[None]:
    """Within the block, a flow run that fails with one of `errors` (or an error `also` says yes to) is logged by
    Prefect in its one line, without the traceback (`QuietInputErrors`): the caller then says what is wrong and the
    fix in a line of its own."""
    quiet = QuietInputErrors(errors, also=also)
    flow_runs = logging.getLogger("prefect.flow_runs")
    flow_runs.addFilter(quiet)
    try:
        yield
    finally:
        flow_runs.removeFilter(quiet)


def write_json(path: str | Path, obj: Any) -> None:
    """Write json through a temp file and a rename, so readers never see half a file."""
    write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def read_instances(envs_dir: str | Path, tag: str, split: str, columns: list[str]):
    """Columns of one instance table written by stage envgen (a polars DataFrame)."""
    from ragen.fileio import read_parquet

    return read_parquet(Path(envs_dir) / tag / f"{split}.parquet", columns,
                        missing_hint="run stage envgen first (dvc repro envgen)")


def read_seeds(envs_dir: str | Path, tag: str, split: str) -> list[int]:
    """The seeds of one instance table written by stage envgen."""
    return read_instances(envs_dir, tag, split, ["seed"])["seed"].to_list()


def read_train_pool(envs_dir: str | Path, tag: str, max_optimal_moves: int = 0) -> list[int]:
    """The train seeds of `tag`, or only those the solver solves in at most `max_optimal_moves` moves (0: all)."""
    import polars as pl

    if max_optimal_moves == 0:
        return read_seeds(envs_dir, tag, "train")
    table = read_instances(envs_dir, tag, "train", ["seed", "optimal_moves"])
    pool = table.filter(pl.col("optimal_moves") <= max_optimal_moves)["seed"].to_list()
    if not pool:
        fewest = table["optimal_moves"].min()
        raise ValueError(f"train.max_optimal_moves={max_optimal_moves} leaves no train instance of {tag} (the easiest "
                         f"needs {fewest} moves); raise it, or set 0 to train on every instance")
    return pool


def read_ceilings(envs_dir: str | Path, tag: str, split: str) -> dict[int, float]:
    """seed -> the solver's success ceiling, from the envgen tables."""
    table = read_instances(envs_dir, tag, split, ["seed", "success_ceiling"])
    return dict(zip(table["seed"].to_list(), table["success_ceiling"].to_list()))


SOURCE_ROOT = Path(__file__).resolve().parents[1]  # the checkout whose ragen/ and flows/ run


def tree_digest(path: str | Path, pattern: str = "*") -> str:
    """sha256 (hex) of the files under `path` that match `pattern`: each one's relative path and bytes, in sorted
    order; of a single file, its bytes; "" when nothing is there."""
    path = Path(path)
    files = [path] if path.is_file() else sorted(p for p in path.rglob(pattern) if p.is_file()) if path.is_dir() else []
    if not files:
        return ""
    digest = hashlib.sha256()
    for file in files:
        digest.update(str(file.relative_to(path) if file != path else file.name).encode() + b"\0")
        digest.update(file.read_bytes() + b"\0")
    return digest.hexdigest()


def source_digest() -> str:
    """sha256 of the project's source code (every .py under ragen/ and flows/), so that a result recorded by one
    version of the code is not read back as another's."""
    return tree_digest(SOURCE_ROOT / "ragen", "*.py") + tree_digest(SOURCE_ROOT / "flows", "*.py")
