"""Run a command against one local Prefect server instead of a server per stage process.

Without a configured server, a stage or `ragen` command run directly starts a local Prefect server of its own
(`prefect_api`, ~3 s on 2 cores; Prefect's own temporary server, which it replaces, took ~5 s and stopped with the
run's Ctrl-C). `python -m flows.server -- dvc repro` starts `prefect server start` once (state in .prefect/), runs the
command with PREFECT_API_URL pointing at it, and stops it afterwards, so each stage pays ~1 s instead. SIGTERM or
SIGHUP to this process ends the command's whole process tree first (`run_command`, `ending_on_termination`). An
already configured PREFECT_API_URL is used as it is. Beside it runs a warm stage server (flows/warm.py), so the
stages of dvc.yaml (`python -m flows.run STAGE`) skip their ~4 s of library imports. `make run` uses this.
Flow runs started under `prefect_api` carry their process's tag, so that a later run can mark Crashed those whose
process was killed outright and never reported their end (`own_flow_runs`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import IO, Callable, Iterator

import psutil

import flows  # noqa: F401  (PREFECT_HOME inside the project)
from flows.common import ending_on_termination, handling_signals

STARTUP_TIMEOUT_S = 120
WARM_TIMEOUT_S = 120
KILL_AFTER_S = 20  # a process that a SIGTERM has not ended by then is killed
DRAIN_TIMEOUT_S = 5  # for the logs and events still queued for a local server before it stops


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def end_tree(pid: int) -> None:
    """SIGTERM to a process and everything it started, then wait for them (killing what is left after
    KILL_AFTER_S). The descendants are listed first: a process that ends leaves its children to init."""
    try:
        root = psutil.Process(pid)
        procs = [*root.children(recursive=True), root]
    except psutil.NoSuchProcess:
        return
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.terminate()
    _, alive = psutil.wait_procs(procs, timeout=KILL_AFTER_S)
    for proc in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()


def stop(server: subprocess.Popen, log: IO[bytes]) -> None:
    """End a helper server and whatever it started (a stage running in the warm server), then close its log."""
    end_tree(server.pid)
    server.wait()
    log.close()


def run_command(argv: list[str], env: dict[str, str]) -> int:
    """Run the command and return its exit code (128 + N when signal N ended it, as a shell reports it).

    Ctrl-C reaches the terminal's process group by itself (DVC, the stage; the Prefect server has a session of
    its own, so that it outlives the stage's last report): here it only must not end the wait before the command
    ends. Whatever else ends the wait (`main`'s SIGTERM or SIGHUP) first ends the command and every process it
    started (DVC, the stage command DVC runs, which passes it on to a stage in the warm server), so that none of
    them goes on without the servers.
    """
    try:
        child = subprocess.Popen(argv, env=env)
    except FileNotFoundError:  # as a shell says it, with its exit code
        print(f"flows.server: {argv[0]}: command not found; give its path, or put its folder on PATH (`make run` "
              "puts .venv/bin there)", file=sys.stderr)
        return 127
    except PermissionError:
        print(f"flows.server: {argv[0]}: permission denied (not an executable file)", file=sys.stderr)
        return 126
    try:
        with handling_signals((signal.SIGINT,), signal.SIG_IGN):  # after the start: the command keeps Ctrl-C
            code = child.wait()
    except BaseException:
        end_tree(child.pid)
        child.wait()
        raise
    return code if code >= 0 else 128 - code


class ServerStartError(RuntimeError):
    """The local Prefect server did not answer its health check in time (its log says why)."""


@contextlib.contextmanager
def local_prefect_server(port: int | None = None) -> Iterator[str]:
    """Yield the API URL of a running Prefect server: the configured one, or one started here for the block."""
    if os.environ.get("PREFECT_API_URL"):
        yield os.environ["PREFECT_API_URL"]
        return
    port = port or free_port()
    url = f"http://127.0.0.1:{port}/api"
    home = Path(os.environ["PREFECT_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    log = open(home / "server.log", "ab")
    env = os.environ | {"PREFECT_SERVER_API_HOST": "127.0.0.1", "PREFECT_SERVER_API_PORT": str(port),
                        "PREFECT_UI_ENABLED": "false"}
    # its own session: Ctrl-C at the terminal must not stop it while the stages still report their end to it
    server = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
                               "--port", str(port), "--no-services"], stdout=log, stderr=log, env=env,
                              start_new_session=True)
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not _healthy(url):
            if server.poll() is not None or time.monotonic() > deadline:
                raise ServerStartError(f"the local Prefect server did not start; see {log.name}")
            time.sleep(0.25)
        yield url
    finally:
        stop(server, log)


@contextlib.contextmanager
def prefect_api() -> Iterator[None]:
    """Within the block, flows report to the Prefect API this process is configured with (PREFECT_API_URL, a test
    harness), or else to a local server started for the block (`local_prefect_server`). Without one, Prefect
    starts its own temporary server, a child in the terminal's process group: Ctrl-C stopped it together with the
    run, which then spent minutes failing to report its end (`ragen ablate`: over two and a half minutes). The
    local server has a session of its own, starts faster (~3 s against ~5 s), and stops after the block, once the
    logs and events still queued for it are sent (as Prefect's test harness does before stopping its server). If it
    does not start (a port taken meanwhile, a locked database), the run goes on with Prefect's temporary server
    and says so."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker
    from prefect.settings import PREFECT_API_URL, temporary_settings

    if PREFECT_API_URL.value():
        with own_flow_runs():
            yield
        return
    with contextlib.ExitStack() as stack:
        try:
            url = stack.enter_context(local_prefect_server())
        except ServerStartError as error:
            print(f"{error}; this run uses Prefect's temporary server instead", file=sys.stderr)
        else:
            stack.enter_context(temporary_settings(updates={PREFECT_API_URL: url}))
            # run last in, first out: the logs, then the events, while the settings still point at the server
            stack.callback(EventsWorker.drain_all, timeout=DRAIN_TIMEOUT_S)
            stack.callback(APILogWorker.drain_all, timeout=DRAIN_TIMEOUT_S)
        with own_flow_runs():
            yield


PROCESS_TAG = "ragen.process:"  # + ragen.liveness.process_tag(): host/pid/start time


@contextlib.contextmanager
def own_flow_runs() -> Iterator[None]:
    """Within the block, the flow runs started carry this process's tag (ragen.process:<host>/<pid>/<start>), and
    before it the API's runs left RUNNING by a process that has ended are marked Crashed (`close_ended_flow_runs`)."""
    from prefect import tags

    from ragen.liveness import process_tag

    close_ended_flow_runs()
    with tags(PROCESS_TAG + process_tag()):
        yield


def close_ended_flow_runs() -> list[str]:
    """Mark Crashed the flow runs the configured Prefect API holds as RUNNING whose process has ended without saying
    so: killed outright (signal 9, most often the kernel's out-of-memory killer), it ran no cleanup and its run would
    read Running for ever. Only runs tagged by a process of this host are judged (`ragen.liveness.has_ended`). Their
    ids; nothing, and no error, when the API cannot be asked (the run goes on as it would)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterState, FlowRunFilterStateType
    from prefect.client.schemas.objects import StateType
    from prefect.states import Crashed

    from ragen.liveness import has_ended

    running = FlowRunFilter(state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.RUNNING])))
    closed = []
    try:
        with get_client(sync_client=True) as client:
            for run in client.read_flow_runs(flow_run_filter=running, limit=200):  # the most one call returns
                ended = [tag for tag in run.tags if tag.startswith(PROCESS_TAG) and has_ended(tag[len(PROCESS_TAG):])]
                if ended:
                    client.set_flow_run_state(run.id, Crashed(message=(
                        f"its process ({ended[0][len(PROCESS_TAG):]}: host/pid/start) ended without reporting the "
                        f"run's end, killed outright (signal 9: most often the kernel's out-of-memory killer); marked "
                        f"by a later run")), force=True)
                    closed.append(str(run.id))
    except Exception:  # noqa: BLE001  (bookkeeping of earlier runs must not stop this one)
        pass
    return closed


@contextlib.contextmanager
def warm_stage_server(env: dict[str, str]) -> Iterator[Callable[[], dict[str, str]]]:
    """Start a `flows.warm` server with `env` (its imports run while the Prefect server starts); yield a function
    that waits until it accepts and returns the variable that points stage commands at it ({} if it never did)."""
    folder = tempfile.mkdtemp(prefix="ragen-warm-")  # private (0700); unix socket paths must stay short
    path = os.path.join(folder, "stages.sock")
    home = Path(env["PREFECT_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    log = open(home / "warm_stage_server.log", "ab")
    server = subprocess.Popen([sys.executable, "-m", "flows.warm", path], stdout=log, stderr=log, env=env)

    def ready() -> dict[str, str]:
        deadline = time.monotonic() + WARM_TIMEOUT_S
        while not os.path.exists(path):
            if server.poll() is not None or time.monotonic() > deadline:
                print(f"the warm stage server did not start (see {log.name}); stages import everything themselves",
                      file=sys.stderr)
                return {}
            time.sleep(0.05)
        return {"RAGEN_STAGE_SERVER": path}

    try:
        yield ready
    finally:
        stop(server, log)
        shutil.rmtree(folder, ignore_errors=True)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        print("usage: python -m flows.server -- COMMAND [ARGS ...]", file=sys.stderr)
        return 2
    port = free_port()
    env = os.environ | {"PREFECT_API_URL": os.environ.get("PREFECT_API_URL") or f"http://127.0.0.1:{port}/api"}
    with ending_on_termination(), warm_stage_server(env) as warm_ready, local_prefect_server(port) as url:
        return run_command(argv, env | {"PREFECT_API_URL": url} | warm_ready())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
