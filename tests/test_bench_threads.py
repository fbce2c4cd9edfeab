"""bench/: every benchmark that computes with torch on the CPU either sets torch's threads from `model.threads`, as the
stages do (its figures then come out the same on any number of cores), or prints the count it ran with (a speed or
memory figure belongs to the machine and its count)."""

import re
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"
# what computes with torch in a script: torch itself, or the ragen modules that run the model
COMPUTES = re.compile(r"^\s*(import torch\b|from ragen\.(policy|evaluation|rollout|train|update|warmstart|batching)\b)",
                      re.MULTILINE)
PINS, PRINTS = "pin_threads(", "get_num_threads()"
# scripts whose output no CPU thread count moves
EXEMPT = {
    "bench_cuda.py": "times and checks the CUDA path; the model computes on the GPU",
    "bench_families.py": "says per transformers model type whether ragen can run it, a yes or no, no figure",
}
# the benchmarks whose figures RESULTS.md compares across machines: learning, evaluation, imitation
FIGURES = {"bench_base.py", "bench_exploration.py", "bench_imitation.py", "bench_learning.py", "bench_overfit.py",
           "bench_paired_eval.py", "bench_self_imitation.py", "bench_fingerprint.py"}


def test_each_torch_benchmark_pins_its_threads_or_prints_them():
    texts = {path.name: path.read_text() for path in sorted(BENCH.glob("*.py"))}
    computing = {name: text for name, text in texts.items() if COMPUTES.search(text)}
    assert FIGURES | set(EXEMPT) <= set(computing)  # the pattern still finds them
    unaccounted = [name for name, text in computing.items()
                   if name not in EXEMPT and PINS not in text and PRINTS not in text]
    assert unaccounted == [], f"set torch's threads (ragen.kernels.pin_threads) or print the count in {unaccounted}"
    unpinned = sorted(name for name in FIGURES if PINS not in computing[name])
    assert unpinned == [], f"{unpinned}: their figures must not follow the machine's cores; pin model.threads"
