"""Whether the process that opened something (an MLflow run, a Prefect flow run, a staging folder) is still alive,
from a tag it left: its host, its pid and its start time.

A process the kernel kills outright (signal 9: the out-of-memory killer, `kill -9`, a batch system's hard limit)
runs none of its cleanups, so what it opened stays open: an MLflow run reads RUNNING for ever. A later process can
close it only if it can tell that the opener is gone and not just running elsewhere, so it needs more than a pid,
which the kernel reuses: the pid's start time (clock ticks after boot, /proc/<pid>/stat field 22) tells a reused pid
from the original. Another host's processes cannot be seen from here, so they always count as alive.
"""

from __future__ import annotations

import hashlib
import os
import socket
from pathlib import Path


def start_time(pid: int) -> str:
    """The start time of process `pid` in clock ticks after boot; "" where /proc cannot tell (no such process, or no
    /proc: not Linux)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[1].split()[19]  # after "pid (comm)": state is field 3, starttime field 22


def host() -> str:
    """This host's name, the first part of a `process_tag`."""
    return socket.gethostname()


def process_tag(pid: int | None = None) -> str:
    """"<host>/<pid>/<start time>" of process `pid` (this one by default)."""
    pid = os.getpid() if pid is None else pid
    return f"{host()}/{pid}/{start_time(pid)}"


def has_ended(tag: str) -> bool:
    """True when the process `tag` names (`process_tag`) ran on this host and is certainly gone: no process has its
    pid, or the one that has it started at another time (a reused pid). False when it may still run: alive, on
    another host, or a tag that cannot be read."""
    parts = tag.rsplit("/", 2)
    if len(parts) != 3 or not parts[1].isdigit():
        return False
    return parts[0] == host() and gone(int(parts[1]), parts[2])


def host_digest() -> str:
    """8 hex digits of this host's name: a host in a file name (a name may hold characters a file name may not)."""
    return hashlib.sha256(host().encode()).hexdigest()[:8]


def process_stamp() -> str:
    """This process as a file name part: "<host digest>-<pid>-<start time>" (`stamp_has_ended`)."""
    return f"{host_digest()}-{os.getpid()}-{start_time(os.getpid())}"


def stamp_has_ended(stamp: str) -> bool:
    """`has_ended` for a `process_stamp`."""
    parts = stamp.split("-")
    if len(parts) != 3 or not parts[1].isdigit():
        return False
    return parts[0] == host_digest() and gone(int(parts[1]), parts[2])


def gone(pid: int, started: str) -> bool:
    """No process of this host has `pid`, or the one that has it did not start at `started` (a reused pid)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # another user's process has the pid: alive; its start time still tells
        pass
    now = start_time(pid)
    return bool(started and now and now != started)
