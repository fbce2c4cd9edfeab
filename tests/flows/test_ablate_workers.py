"""How many variants `ragen ablate` runs at once on its thread pool (per CPU core pair, or one on a GPU), and which
variant's failure ends a set whose Dask workers died."""

import os
from concurrent.futures import Future

import pytest

from flows.ablate import NoWorkerLeft, set_results, task_runner, workers_here
from ragen.ablation import AblationError, AblationRun, RunnerSpec


def test_the_pool_follows_the_device_the_params_resolve_to(tmp_path, monkeypatch):
    import torch

    from ragen.policy.model import ModelLoadError

    params = tmp_path / "params.yaml"
    params.write_text("model:\n  device: cuda\n")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ModelLoadError, match=r"^model.device=cuda: this torch \("):  # the variants run here
        workers_here(RunnerSpec(), str(params))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a GPU machine: nothing is loaded
    assert workers_here(RunnerSpec(), str(params)) == 1
    assert task_runner(RunnerSpec(), str(params))._max_workers == 1
    assert workers_here(RunnerSpec(workers=4), str(params)) == 4
    params.write_text("model:\n  device: cpu\n")
    assert workers_here(RunnerSpec(), str(params)) == max(1, (os.cpu_count() or 2) // 2)
    assert task_runner(RunnerSpec(workers=3), str(params))._max_workers == 3


def future_of(result=None, error=None):
    future = Future()
    future.set_exception(error) if error is not None else future.set_result(result)
    return future


def test_a_variant_that_waited_for_a_worker_yields_to_a_later_one_whose_workers_died(tmp_path):
    """The CI run of 2026-12-07: the nanny of a one-worker cluster closed after two variants' workers died, and the
    other two variants timed out waiting; the set named the first of those, a timeout, not the memory it ran out
    of."""
    distributed = pytest.importorskip("distributed.scheduler")
    params = tmp_path / "params.yaml"
    params.write_text("train:\n  micro_batch_size: 4\n")
    runs = [AblationRun(f"v{i}", "v", None, ()) for i in range(4)]
    waited = distributed.NoWorkerError("run_variant-1", 120.0)
    died = distributed.KilledWorker("run_variant-2", None, 3)
    with pytest.raises(AblationError, match=r"^variant v2: every Dask worker that ran it died") as raised:
        set_results(runs, [future_of({"ok": 0}), future_of(error=waited), future_of(error=died),
                           future_of(error=waited)], str(params), "tcp://127.0.0.1:1")
    assert not isinstance(raised.value, NoWorkerLeft)
    # with no death among the later ones the wait is the error; a set that ran gives every summary in order
    with pytest.raises(NoWorkerLeft, match=r"^variant v1: the Dask cluster had no worker .*`dask worker tcp://"):
        set_results(runs[:3], [future_of({}), future_of(error=waited), future_of(error=waited)], str(params),
                    "tcp://127.0.0.1:1")
    assert list(set_results(runs[:2], [future_of({"a": 1}), future_of({"b": 2})], str(params))) == ["v0", "v1"]
