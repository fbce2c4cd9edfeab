"""Pinning torch's CPU kernels: AVX2 on every x86 CPU that has it, unless the environment names a capability."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ragen.kernels import PINNED, VARIABLE, cpu_flags, pin, pin_threads

ROOT = Path(__file__).resolve().parents[1]


def test_an_x86_cpu_with_avx2_and_fma_is_pinned_to_avx2():
    env = {}
    assert pin(env, machine="x86_64", flags={"sse4_2", "avx2", "fma", "avx512f"}) == "avx2"
    assert env == {VARIABLE: "avx2"} and PINNED == "avx2"
    env = {}
    assert pin(env, machine="AMD64", flags={"avx2", "fma"}) == "avx2" and env[VARIABLE] == "avx2"


def test_the_users_capability_stands_and_no_pin_where_avx2_is_missing_or_unknown():
    env = {VARIABLE: "avx512"}
    assert pin(env, machine="x86_64", flags={"avx2", "fma"}) == "avx512" and env == {VARIABLE: "avx512"}
    for machine, flags in [("x86_64", {"avx2"}), ("x86_64", {"avx", "fma"}), ("x86_64", set()),
                           ("aarch64", {"avx2", "fma"}), ("arm64", set())]:
        env = {}
        assert pin(env, machine=machine, flags=flags) is None and env == {}, (machine, flags)


def test_cpu_flags_reads_the_first_flags_line(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse2 avx2 fma\n\n"
                    "processor\t: 1\nflags\t\t: fpu\n")
    assert cpu_flags(info) == {"fpu", "sse2", "avx2", "fma"}
    assert cpu_flags(tmp_path / "missing") == set()
    (tmp_path / "none").write_text("processor\t: 0\n")
    assert cpu_flags(tmp_path / "none") == set()


def run_capability(env: dict[str, str]) -> str:
    code = "import ragen, torch; print(torch.backends.cpu.get_cpu_capability())"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return done.stdout.strip()


def test_importing_ragen_pins_the_process_and_an_explicit_choice_wins():
    env = {k: v for k, v in os.environ.items() if k != VARIABLE}
    if pin({}) is None:  # this machine's own answer, from the same check
        pytest.skip("not an x86 CPU with AVX2 and FMA")
    assert run_capability(env) == "AVX2"
    assert run_capability({**env, VARIABLE: "default"}) == "DEFAULT"


def test_every_stage_that_computes_with_torch_depends_on_the_pin():
    """The pin decides the bytes of every torch stage's output, so a change to it reruns them under `dvc repro`."""
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    torch_stages = {name for name, stage in stages.items()
                    if {"ragen/policy", "ragen/filters.py"} & set(stage["deps"])}
    assert torch_stages == {"base", "rollout", "filter", "critic_fit", "update", "evaluate"}
    assert all("ragen/kernels.py" in stages[name]["deps"] for name in torch_stages)


def test_pin_threads_sets_torchs_count_and_zero_gives_back_torchs_own_pick():
    import torch

    own = pin_threads(0)  # torch's own count (captured at the process's first pin)
    try:
        assert pin_threads(3) == 3 == torch.get_num_threads()  # more threads than cores: allowed, same sums
        assert pin_threads(1) == 1 == torch.get_num_threads()
        assert pin_threads(0) == own
    finally:
        pin_threads(0)
