"""A warm stage server: the pipeline's third-party imports paid once, each stage in a fresh fork.

Every DVC stage is its own `python` process, and before it does any work it imports torch, transformers, polars,
Prefect and MLflow (MLflow's sqlite store alone pulls in SQLAlchemy and alembic): ~4 s on 2 cores, eight times
per pipeline. `python -m flows.server -- dvc repro` (what `make run` runs) starts this server next to the Prefect
server. It imports those libraries once, then for each stage command (`python -m flows.run STAGE`, the thin
client in dvc.yaml) forks a child that takes over the client's stdin/stdout/stderr (passed over a unix socket),
working directory, environment and arguments, imports the project's own modules (`flows`, `ragen`) fresh from
that directory, and runs the stage's `__main__`. The client exits with the child's exit code, so DVC sees what it
would see without the server. The server also sends the child's peak resident memory, so that a stage the kernel
kills for memory (signal 9, where the stage itself can say nothing) still ends with a line saying so (flows/run.py).

Safe by construction:
- only third-party libraries are preloaded; `flows.*` and `ragen.*` are always imported fresh in the child, so a
  stage runs the code on disk, as DVC hashed it;
- the server refuses a client whose PREFECT_*, MLFLOW_*, ATEN_*, OMP_* or MKL_* environment differs from its own
  (those libraries read some settings at import; torch fixes its CPU kernels once a process, and OpenMP its thread
  count when it loads: a fork would compute with the server's), and the client then runs the stage in its own
  process, as it does without a server;
- the server forks only while it has a single thread (imports start none), and serves one stage at a time (DVC
  runs stages one after another; a second client waits for the first).
"""

from __future__ import annotations

import json
import os
import runpy
import signal
import socket
import struct
import sys
import threading
import traceback
from typing import Any

PRELOAD = [
    "torch", "transformers", "transformers.models.qwen2.modeling_qwen2", "tokenizers", "safetensors.torch",
    "polars", "omegaconf", "yaml",
    "prefect", "prefect.flows", "prefect.tasks", "prefect.settings", "prefect.cache_policies",
    "prefect.task_runners", "prefect.client.orchestration",
    "mlflow", "mlflow.entities", "mlflow.tracking", "mlflow.store.tracking.sqlalchemy_store",
    "matplotlib", "matplotlib.pyplot",
]
HEADER = struct.Struct("!Q")  # byte length of the json request that follows
CODE = struct.Struct("!i")  # a pid, then an exit code
PEAK = struct.Struct("!Q")  # after the exit code: the stage's peak resident memory, bytes
RSS_UNIT = 1 if sys.platform == "darwin" else 1024  # bytes in a unit of ru_maxrss: KiB on Linux, bytes on macOS
SETTING_PREFIXES = ("PREFECT_", "MLFLOW_", "ATEN_", "OMP_", "MKL_")
OWN_PACKAGES = ("flows", "ragen")


def settings_env(env: dict[str, str]) -> dict[str, str]:
    """The environment variables the preloaded libraries may have read at import."""
    return {k: v for k, v in env.items() if k.startswith(SETTING_PREFIXES)}


def preload() -> None:
    os.environ.setdefault("MPLBACKEND", "Agg")
    import importlib

    for name in PRELOAD:  # transformers loads model classes lazily: Qwen2's is named
        importlib.import_module(name)


def recv_exactly(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise ConnectionError("the other side closed the connection")
        data += chunk
    return data


def receive(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    """One request: its JSON body and the client's stdin, stdout and stderr; on a malformed request the received
    descriptors are closed before the error propagates (a long-lived server must not leak them)."""
    header, fds, _, _ = socket.recv_fds(conn, HEADER.size, 3)
    try:
        if len(header) < HEADER.size:
            header += recv_exactly(conn, HEADER.size - len(header))
        (size,) = HEADER.unpack(header)
        return json.loads(recv_exactly(conn, size)), list(fds)
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


def reap(pid: int) -> tuple[int, int]:
    """Wait for child `pid` to end: its exit code (-N when signal N ended it) and its peak resident memory in bytes.
    A signal handler that returns meanwhile does not end the wait (PEP 475)."""
    _, status, usage = os.wait4(pid, 0)
    return os.waitstatus_to_exitcode(status), usage.ru_maxrss * RSS_UNIT


def run_child(request: dict[str, Any], fds: list[int]) -> int:
    """In the forked child: become the client's stage process and run the stage; returns its exit code."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    for target, fd in zip((0, 1, 2), fds):
        os.dup2(fd, target)
        os.close(fd)
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(line_buffering=True)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    for name in [m for m in sys.modules if m.split(".")[0] in OWN_PACKAGES]:
        del sys.modules[name]
    sys.path[0] = request["cwd"]
    sys.argv = [request["module"], *request["argv"]]
    try:
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
        return 0
    except SystemExit as done:
        if done.code is None or isinstance(done.code, int):
            return done.code or 0
        print(done.code, file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C: as python reports it (the traceback, then 128 + SIGINT)
        traceback.print_exc()
        return 130
    except BaseException:  # noqa: BLE001  (the stage's own failure: report it as python would)
        traceback.print_exc()
        return 1


def serve(path: str) -> int | None:
    """Accept stage requests on the unix socket `path` until terminated; returns a code only in a child."""
    own_settings = settings_env(dict(os.environ))  # what the libraries see while they import
    preload()
    if threading.active_count() != 1:
        print(f"warm stage server: {threading.active_count()} threads after the imports; not forking", file=sys.stderr)
        return None
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the stage child (same process group)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path + ".tmp")
    listener.listen(16)
    os.replace(path + ".tmp", path)  # the path appears only once the server accepts
    while True:
        conn, _ = listener.accept()
        with conn:
            try:
                request, fds = receive(conn)
            except (OSError, ValueError, ConnectionError):
                continue
            if settings_env(request["env"]) != own_settings:
                for fd in fds:
                    os.close(fd)
                try:
                    conn.sendall(b"R")
                except OSError:
                    pass
                continue
            pid = os.fork()
            if pid == 0:
                listener.close()
                conn.close()
                return run_child(request, fds)
            for fd in fds:
                os.close(fd)
            try:
                conn.sendall(b"P" + CODE.pack(pid))
            except OSError:
                pass
            code, peak = reap(pid)
            try:
                conn.sendall(CODE.pack(code) + PEAK.pack(peak))
            except OSError:
                pass


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m flows.warm SOCKET_PATH", file=sys.stderr)
        return 2
    code = serve(argv[0])
    return 1 if code is None else code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
