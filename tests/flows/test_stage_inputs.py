"""Every config key a stage reads is one of its DVC params, and every project source file whose code it runs is one of
its DVC deps, so `dvc repro` reruns the stage when either changes: each stage runs in process on a small project
while the config's fields record who reads them and a profiler records which files' functions run (slow)."""

import sys
import threading
from pathlib import Path

import pytest
import yaml

import flows.base
import flows.critic_fit
import flows.envgen
import flows.evaluate
import flows.filter
import flows.report
import flows.rollout
import flows.update
from flows.lineage import CHAIN, KEYS, NOT_DECIDING, own_settings
from ragen import config as config_module
from ragen.config import Config
from smallproject import ROOT, write_params

# where is the stage's flow function, and which module's load_config it calls
STAGES = {"envgen": (flows.envgen, "envgen"), "base": (flows.base, "base"), "rollout": (flows.rollout, "rollout"),
          "filter": (flows.filter, "filter_rollouts"), "critic_fit": (flows.critic_fit, "critic_fit"),
          "update": (flows.update, "update_policy"), "evaluate": (flows.evaluate, "evaluate"),
          "report": (flows.report, "report")}
SECTIONS = {"envs": config_module.EnvsConfig, "model": config_module.ModelConfig, "base": config_module.BaseConfig,
            "rollout": config_module.RolloutConfig, "filter": config_module.FilterConfig,
            "critic": config_module.CriticConfig, "algo": config_module.AlgoConfig, "train": config_module.TrainConfig,
            "eval": config_module.EvalConfig}  # not tracking: where runs are logged decides no output


def not_for_an_output(frame) -> bool:
    """A read under ragen.tracking (MLflow's params and tags, the preset a run is tagged with), under config_digest
    (a checkpoint's and a run's identity), under flows.lineage (an input's record compared with the run's settings:
    whether the stage runs, not what it writes; the keys it records are the stage's own, which it reads anyway) or by
    Prefect itself (it walks a task's arguments for its run record): it decides no output. A dataclass copy (asdict,
    replace) counts: what it copies is used."""
    if "/prefect/" in frame.f_code.co_filename:
        return True
    while frame is not None:
        code = frame.f_code
        if code.co_filename.endswith(("ragen/tracking.py", "flows/lineage.py")) or code.co_name == "config_digest":
            return True
        frame = frame.f_back
    return False


class Reads:
    """Field reads of the config's sections by the running stage: "section.key"."""

    def __init__(self):
        self.on, self.keys, self.mine = False, set(), set()

    def install(self, monkeypatch):
        for section, cls in SECTIONS.items():
            fields = set(cls.__dataclass_fields__)

            def getattribute(obj, name, section=section, fields=fields):
                if (self.on and name in fields and id(obj) in self.mine
                        and not not_for_an_output(sys._getframe(1))):
                    self.keys.add(f"{section}.{name}")
                return object.__getattribute__(obj, name)

            monkeypatch.setattr(cls, "__getattribute__", getattribute)

    def load_config_of(self, load_config):
        def wrapped(*args, **kwargs):  # validation reads every key; what counts starts with the stage's own code
            cfg = load_config(*args, **kwargs)
            if not self.on:  # the stage's own config (not a preset's reference config built later)
                self.mine = {id(getattr(cfg, section)) for section in SECTIONS}
                self.on = True
            return cfg
        return wrapped


class Runs:
    """The project's source files whose functions run while recording (ragen/ and flows/), relative to ROOT."""

    def __init__(self):
        self.files = set()
        self.prefixes = (str(ROOT / "ragen") + "/", str(ROOT / "flows") + "/")

    def __call__(self, frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(self.prefixes):
            self.files.add(str(Path(frame.f_code.co_filename).relative_to(ROOT)))


# files a stage runs that decide none of its outputs: MLflow logging, the process tags that let a later run close a run
# or remove a staging folder whose process was killed, and the preset a run is tagged with (a preset given as an
# override is resolved into the params DVC tracks); stage report writes the preset into its report. ragen/kernels.py
# runs in envgen and report only for the `ragen.cpu_kernels` tag; its pins (the capability at import, the threads in
# each torch stage) decide the torch stages' bytes, so those list it (tests/test_kernels.py checks them)
NO_OUTPUT = {"ragen/tracking.py", "ragen/liveness.py", "ragen/presets.py", "ragen/kernels.py"}
DECIDES_OUTPUT = {"report": {"ragen/presets.py"}}


def in_deps(path, deps):
    return any(path == dep or path.startswith(dep.rstrip("/") + "/") for dep in deps)


def covered(key, params):
    return key in params or key.split(".")[0] in params


@pytest.mark.slow
def test_every_config_key_and_source_file_a_stage_uses_is_declared_in_dvc_yaml(prefect_harness, project, monkeypatch):
    write_params(project)
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    assert set(stages) == set(STAGES)
    reads = Reads()
    reads.install(monkeypatch)
    uncovered, read_by, undeclared, ran = {}, {}, {}, {}
    for stage, (module, name) in STAGES.items():
        monkeypatch.setattr(module, "load_config", reads.load_config_of(config_module.load_config))
        reads.on, reads.keys, reads.mine = False, set(), set()
        runs = Runs()
        threading.setprofile(runs)
        sys.setprofile(runs)
        try:
            getattr(module, name)()
        finally:
            sys.setprofile(None)
            threading.setprofile(None)
        deps = stages[stage]["deps"]
        missing_files = sorted(f for f in runs.files - (NO_OUTPUT - DECIDES_OUTPUT.get(stage, set()))
                               if not in_deps(f, deps))
        if missing_files:
            undeclared[stage] = missing_files
        ran[stage] = runs.files
        reads.on = False
        read_by[stage] = reads.keys
        missing = sorted(key for key in reads.keys if not covered(key, stages[stage].get("params", [])))
        if missing:
            uncovered[stage] = missing
    # the recording works: each stage reads keys it is known to depend on
    assert {"envs.tags", "envs.train_size"} <= read_by["envgen"] and "base.steps" in read_by["base"]
    assert {"train.env", "rollout.max_turns"} <= read_by["rollout"] and "filter.keep_ratio" in read_by["filter"]
    assert "critic.warmup_epochs" in read_by["critic_fit"] and "algo.clip_eps_high" in read_by["update"]
    assert {"eval.temperature", "eval.samples"} <= read_by["evaluate"] and "train.steps" in read_by["report"]
    # every stage that computes with torch sets its thread count first (ragen.kernels.pin_threads)
    assert all("model.threads" in read_by[stage] for stage in ("base", "rollout", "filter", "critic_fit", "update",
                                                                "evaluate"))
    assert not uncovered, f"config keys read by a stage but not among its params in dvc.yaml: {uncovered}"
    # what each output of the RL chain records of its settings (flows.lineage) covers every key its stage read that
    # can change it, and the stages before it; each recorded key is among the stage's params
    for stage in KEYS:
        recorded = {key for before in CHAIN[: CHAIN.index(stage) + 1] for key in own_settings(before, Config())}
        assert read_by[stage] - set(NOT_DECIDING) <= recorded, (stage, read_by[stage] - set(NOT_DECIDING) - recorded)
        assert all(covered(key, stages[stage]["params"]) for key in own_settings(stage, Config())), stage
    # and the profiler works: each stage runs the code it is known to run
    assert "ragen/instances.py" in ran["envgen"] and "ragen/warmstart.py" in ran["base"]
    assert {"ragen/rollout.py", "ragen/envs/frozen_lake.py"} <= ran["rollout"] and "ragen/filters.py" in ran["filter"]
    assert "ragen/batching.py" in ran["critic_fit"] and {"ragen/losses.py", "ragen/update.py"} <= ran["update"]
    assert "ragen/evaluation.py" in ran["evaluate"] and "ragen/report.py" in ran["report"]
    assert not undeclared, f"project files a stage runs but not among its deps in dvc.yaml: {undeclared}"
