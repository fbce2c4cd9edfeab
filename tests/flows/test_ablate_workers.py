"""How many variants `ragen ablate` runs at once on its thread pool: per CPU core pair, or one on a GPU."""

import os

from flows.ablate import task_runner, workers_here
from ragen.ablation import RunnerSpec


def test_the_pool_follows_the_device_the_params_resolve_to(tmp_path):
    params = tmp_path / "params.yaml"
    params.write_text("model:\n  device: cuda\n")  # resolved without a GPU present: nothing is loaded
    assert workers_here(RunnerSpec(), str(params)) == 1
    assert task_runner(RunnerSpec(), str(params))._max_workers == 1
    assert workers_here(RunnerSpec(workers=4), str(params)) == 4
    params.write_text("model:\n  device: cpu\n")
    assert workers_here(RunnerSpec(), str(params)) == max(1, (os.cpu_count() or 2) // 2)
    assert task_runner(RunnerSpec(workers=3), str(params))._max_workers == 3
