"""`python -m flows.run STAGE [key=value ...]`: run stage `flows.STAGE`, in a warm stage server when one is up.

dvc.yaml's commands. With $RAGEN_STAGE_SERVER naming the socket of a running `flows.warm` server (set by
`python -m flows.server`, i.e. `make run`), the stage runs in a fork of that server, which has the heavy
libraries imported already; otherwise (no server, a refused request, or a server that went away) it runs as
`python -m flows.STAGE` in a child process. The output, exit code and files are the same either way. Standard
library only, so this process starts in milliseconds. Either way this process is the stage's parent or speaks for
it, so a stage that ends by signal 9 (SIGKILL: on Linux, most often the kernel's out-of-memory killer, which gives
the stage no chance to say anything) gets a last line from here: its peak memory against the machine's and the
settings that bound what it holds at once (`flows.memory.killed_message`).
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import sys

from flows.warm import CODE, HEADER, PEAK, reap, recv_exactly

NEEDED = ("torch", "prefect", "mlflow", "polars", "omegaconf", "transformers")  # what every stage imports


def run_warm(path: str, module: str, argv: list[str]) -> int | None:
    """The stage's exit code from the server at `path`; None when it cannot or will not run it."""
    try:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(path)
    except OSError:
        return None
    with conn:
        body = json.dumps({"module": module, "argv": argv, "cwd": os.getcwd(), "env": dict(os.environ)}).encode()
        try:
            socket.send_fds(conn, [HEADER.pack(len(body))], [0, 1, 2])
            conn.sendall(body)
            answer = recv_exactly(conn, 1)
        except (OSError, ConnectionError):
            return None
        if answer != b"P":
            return None
        (pid,) = CODE.unpack(recv_exactly(conn, CODE.size))

        forward_signals(pid)
        try:
            (code,) = CODE.unpack(recv_exactly(conn, CODE.size))
            (peak,) = PEAK.unpack(recv_exactly(conn, PEAK.size))
        except ConnectionError:
            print(f"the warm stage server lost stage {module} (pid {pid})", file=sys.stderr)
            return 1
    return stage_exit(module, argv, code, peak)


def forward_signals(pid: int) -> None:
    """From here on, SIGTERM and SIGHUP to this process go on to the stage `pid`, and Ctrl-C, which reaches the stage
    directly (same process group), does not end the wait for it."""
    def forward(signum: int, _frame: object) -> None:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass

    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, forward)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def run_child(module: str, argv: list[str]) -> int:
    """The stage as `python -m MODULE ARGV` in a child process; its exit code, 128 + N when signal N ended it."""
    pid = os.posix_spawn(sys.executable, [sys.executable, "-m", module, *argv], os.environ)
    forward_signals(pid)
    return stage_exit(module, argv, *reap(pid))


def stage_exit(module: str, argv: list[str], code: int, peak: int) -> int:
    """The stage's exit code as a shell reports it (128 + N when signal N ended it), after its last line when that
    signal was SIGKILL (`report_kill`)."""
    if code == -signal.SIGKILL:
        report_kill(module, argv, peak)
    return code if code >= 0 else 128 - code


def report_kill(module: str, argv: list[str], peak: int) -> None:
    """The last line of a stage killed by signal 9: "update: killed by signal 9 (SIGKILL) at a peak of ...". The
    settings come from the stage's own config (params.yaml and its overrides), left out if that does not load."""
    stage = module.removeprefix("flows.")
    try:  # imports torch: seconds, paid only after a kill
        from flows.memory import killed_message, machine_memory
        from ragen.config import load_config

        try:
            cfg = load_config("params.yaml", argv)
        except Exception:  # noqa: BLE001  (no config, or one the stage refused: the line goes without its settings)
            cfg = None
        line = killed_message(stage, peak, machine_memory(), cfg)
    except Exception as error:  # noqa: BLE001  (the exit code must reach DVC whatever goes wrong here)
        line = f"killed by signal 9 (SIGKILL) ({type(error).__name__} while saying more: {error})"
    print(f"{stage}: {line}", file=sys.stderr)


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m flows.run STAGE [key=value ...]", file=sys.stderr)
        return 2
    module = argv[0] if "." in argv[0] else f"flows.{argv[0]}"
    try:
        found = importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a package on the way is missing
        found = False
    if not found:  # before: the child's "No module named flows.X"
        print(f"flows.run: no stage {argv[0]} (no module {module}); the stages are dvc.yaml's, as `python -m flows.run "
              "update`", file=sys.stderr)
        return 2
    missing = [name for name in NEEDED if importlib.util.find_spec(name) is None]
    if missing:  # before: the stage's ModuleNotFoundError traceback, e.g. a system `python` under `.venv/bin/dvc`
        print(f"{module.removeprefix('flows.')}: {sys.executable} has no {', '.join(missing)}: the stages need the "
              "project's environment; run dvc from it (`source .venv/bin/activate`, then `dvc exp run ...`), or "
              "`make run`", file=sys.stderr)
        return 2
    server = os.environ.get("RAGEN_STAGE_SERVER")
    if server:
        code = run_warm(server, module, argv[1:])
        if code is not None:
            return code
    return run_child(module, argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
