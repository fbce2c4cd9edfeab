"""A command run as a process of its own, in a session of its own, for the tests that signal it (flows/server.py,
run_stage, `ragen ablate`): the signal reaches only what the test means, and whatever is left is killed after."""

import contextlib
import os
import signal
import subprocess
import time

import psutil


@contextlib.contextmanager
def own_session(argv, cwd, prefect_home, **popen):
    """Start `argv` in `cwd` with Prefect's state in `prefect_home` and no Prefect server, MLflow store or warm stage
    server of the test process; yield the process; kill its whole session afterwards."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PREFECT_API", "MLFLOW_TRACKING")) and k != "RAGEN_STAGE_SERVER"}
    env["PREFECT_HOME"] = str(prefect_home)
    process = subprocess.Popen(argv, cwd=cwd, env=env, start_new_session=True, **popen)
    try:
        yield process
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)


def wait_until(ready, process, timeout, what):
    """Poll `ready()` until it holds; fail with `what()` if `process` ends first or `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    while not ready():
        assert process.poll() is None and time.monotonic() < deadline, what()
        time.sleep(0.2)


def left_running(prefect_home):
    """The processes still running with Prefect's state in `prefect_home` (a server started for the command, in a
    session of its own, is not in the command's)."""
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if proc.environ().get("PREFECT_HOME") == str(prefect_home):
                found.append(" ".join(proc.cmdline())[:200])
    return found
