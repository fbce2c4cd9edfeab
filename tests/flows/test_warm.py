"""flows.warm / flows.run: stages run in a fork of a warm server, exactly as they would in their own process."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROBE = """
import os, sys
print("argv", sys.argv[1:])
print("cwd", os.getcwd())
print("marker", os.environ.get("PROBE_MARKER"))
print("parent", os.getppid())
print("torch preloaded", "torch" in sys.modules)
print("flows from", __import__("flows").__file__)
print("to stderr", file=sys.stderr)
raise SystemExit(int(os.environ.get("PROBE_CODE", "0")))
"""


@pytest.fixture
def warm_server(tmp_path):
    path = str(tmp_path / "s.sock")
    env = os.environ | {"PREFECT_HOME": str(tmp_path / "prefect")}
    server = subprocess.Popen([sys.executable, "-m", "flows.warm", path], cwd=ROOT, env=env)
    deadline = time.monotonic() + 120
    while not os.path.exists(path):
        assert server.poll() is None and time.monotonic() < deadline, "the warm server did not start"
        time.sleep(0.05)
    yield path, server.pid, env
    server.terminate()
    server.wait(timeout=20)


def run_client(cwd, env, *args):
    return subprocess.run([sys.executable, "-m", "flows.run", *args], cwd=cwd, capture_output=True, text=True,
                          env=env | {"PYTHONPATH": f"{cwd}:{ROOT}"})


def stage_dir(tmp_path):
    """A project copy with the probe as a stage module (flows/probe.py), so the child imports from there."""
    project = tmp_path / "project"
    (project / "flows").mkdir(parents=True)
    (project / "flows" / "__init__.py").write_text((ROOT / "flows" / "__init__.py").read_text())
    (project / "flows" / "warm.py").write_text((ROOT / "flows" / "warm.py").read_text())
    (project / "flows" / "run.py").write_text((ROOT / "flows" / "run.py").read_text())
    (project / "flows" / "memory.py").write_text((ROOT / "flows" / "memory.py").read_text())
    (project / "flows" / "probe.py").write_text(PROBE)
    return project


def test_a_stage_runs_in_a_fork_of_the_server_with_the_clients_io_cwd_env_and_exit_code(warm_server, tmp_path):
    path, server_pid, env = warm_server
    project = stage_dir(tmp_path)
    done = run_client(project, env | {"RAGEN_STAGE_SERVER": path, "PROBE_MARKER": "m1", "PROBE_CODE": "3"},
                      "probe", "a=1", "b=2")
    assert done.returncode == 3
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    assert lines["argv"] == "['a=1', 'b=2']" and lines["cwd"] == str(project) and lines["marker"] == "m1"
    assert lines["parent"] == str(server_pid) and lines["torch"] == "preloaded True"
    assert lines["flows"] == f"from {project / 'flows' / '__init__.py'}"  # the project's code, not the server's
    assert done.stderr.strip() == "to stderr"


def test_other_library_settings_or_no_server_run_the_stage_in_a_process_of_its_own(warm_server, tmp_path):
    path, server_pid, env = warm_server
    project = stage_dir(tmp_path)
    for extra in ({"RAGEN_STAGE_SERVER": path, "MLFLOW_TRACKING_URI": "sqlite:////elsewhere.db"},
                  {"RAGEN_STAGE_SERVER": path, "OMP_NUM_THREADS": "1"},  # a fork would run the server's threads
                  {"RAGEN_STAGE_SERVER": str(tmp_path / "missing.sock")}, {}):
        done = run_client(project, env | extra | {"PROBE_CODE": "4"}, "probe")
        assert done.returncode == 4
        assert f"parent {server_pid}" not in done.stdout and "torch preloaded False" in done.stdout


def test_a_stage_that_is_not_there_is_one_line(tmp_path):
    """Before: the child's "No module named flows.nosuch" from runpy, exit code 1."""
    done = run_client(stage_dir(tmp_path), dict(os.environ), "nosuch", "a=1")
    assert (done.returncode, done.stderr) == (2, "flows.run: no stage nosuch (no module flows.nosuch); the stages "
                                                 "are dvc.yaml's, as `python -m flows.run update`\n")


def test_a_python_without_the_projects_packages_is_one_line(tmp_path):
    """As `.venv/bin/dvc exp run` ran the stages where `python` on PATH was the system's (DVC runs each stage's
    command through the shell): before, the stage's ModuleNotFoundError traceback for torch."""
    project = stage_dir(tmp_path)
    done = subprocess.run([sys.executable, "-S", "-m", "flows.run", "probe"], cwd=project, capture_output=True,
                          text=True, env=dict(os.environ) | {"PYTHONPATH": f"{project}:{ROOT}"})  # -S: no site-packages
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (f"probe: {sys.executable} has no torch, prefect, mlflow, polars, omegaconf, transformers: "
                           "the stages need the project's environment; run dvc from it (`source .venv/bin/activate`, "
                           "then `dvc exp run ...`), or `make run`\n")


def test_a_malformed_request_closes_the_descriptors_it_carried():
    import socket
    from flows.warm import HEADER, receive

    server, client = socket.socketpair(socket.AF_UNIX)
    read_end, write_end = os.pipe()
    body = b"{not json"
    socket.send_fds(client, [HEADER.pack(len(body)) + body], [read_end, write_end])
    client.close()
    before = set(os.listdir("/proc/self/fd"))
    with pytest.raises(ValueError):
        receive(server)
    server.close()
    leaked = set(os.listdir("/proc/self/fd")) - before
    assert leaked == set()
    os.close(read_end)
    os.close(write_end)


KILLED = """
import os, signal
held = bytearray(300 * 2**20)  # touched: resident
os.kill(os.getpid(), signal.SIGKILL)  # as the kernel's out-of-memory killer ends a process
"""


@pytest.mark.parametrize("warm", [True, False], ids=["in the warm server", "without it"])
def test_a_stage_killed_outright_ends_with_a_line_of_its_peak_memory_and_the_settings(warm_server, tmp_path, warm):
    path, _, env = warm_server
    env = env | {"RAGEN_STAGE_SERVER": path} if warm else env
    project = stage_dir(tmp_path)
    (project / "flows" / "evaluate.py").write_text(KILLED)
    (project / "params.yaml").write_text((ROOT / "params.yaml").read_text())
    done = run_client(project, env, "evaluate", "eval.episodes=96")
    assert done.returncode == 137  # 128 + SIGKILL, as a shell reports it
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("evaluate: killed by signal 9 (SIGKILL) at a peak of ")
    peak = float(last.split("at a peak of ")[1].split(" GiB")[0])
    assert 0.3 <= peak < 8  # the 300 MiB it held (and the warm server's preloaded libraries), as the kernel counted
    assert last.endswith("what it holds at once: 96 episodes sample at once (eval.episodes=96 per split): "
                         "rollout.max_episodes_per_pass=24 samples them in passes of that many (other random draws, "
                         "so what samples runs anew); fewer episodes change the experiment")  # its config and overrides
    (project / "params.yaml").write_text("no_such_section: {}\n")  # a config the stage would refuse
    done = run_client(project, env, "evaluate")
    assert done.returncode == 137
    assert done.stderr.strip().splitlines()[-1].endswith("says so where you may read them)")
