"""Which vector kernels, and how many threads, torch runs on the CPU: pinned so that x86 machines with and without
AVX-512 train the same weights from the same seed, and the thread count does not follow the machine's cores.

ATen picks its elementwise and reduction kernels (softmax, norms, activations, the optimizer's arithmetic) by the CPU's
best instruction set, once per process, at its first kernel call. AVX-512 and AVX2 kernels round differently in the
last bits; over the warm start's 1,200 steps those bits grow into other weights (bench/RESULTS.md, "Why machines
disagree": an AVX-512 AMD EPYC trained the `0da36036` base, an AVX2 one `16bcabd8`; the AVX-512 machine with
`ATEN_CPU_CAPABILITY=avx2` trained `16bcabd8` byte for byte). So, on an x86 CPU that has AVX2 and FMA, `pin` sets
`ATEN_CPU_CAPABILITY=avx2` unless the environment already names a capability (the user's choice stands: `avx512`,
`default`). Imported by `ragen/__init__.py` before torch, which reads the variable lazily; a process that ran a
torch kernel before importing ragen keeps the capability it had (`in_effect` says which).

The thread count parts weights too: torch's parallel kernels split their work by it, and where a split cuts a sum the
order of its additions changes; a base warm-started with 4 threads is another base (bench/RESULTS.md, "Threads"). torch
starts with one thread per physical core, so a laptop and the 2-core CI machine would disagree; every torch stage
sets `model.threads` (2, CI's count) with `pin_threads` before it computes.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

VARIABLE = "ATEN_CPU_CAPABILITY"
PINNED = "avx2"


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str]:
    """The CPU's feature flags from the first `flags` line of `cpuinfo` (Linux); empty where there is none."""
    try:
        with open(cpuinfo, encoding="ascii", errors="replace") as lines:
            for line in lines:
                if line.startswith("flags"):
                    return set(line.partition(":")[2].split())
    except OSError:
        pass
    return set()


def pin(environ: os._Environ | dict[str, str] = os.environ, machine: str | None = None,
        flags: set[str] | None = None) -> str | None:
    """Set `ATEN_CPU_CAPABILITY=avx2` in `environ` on an x86-64 CPU with AVX2 and FMA (the instructions ATen's AVX2
    kernels need; torch's sources take the variable's word for them) where no capability is set. The
    capability the variable names afterwards, or None (not x86, the flags unreadable or lacking: torch's own pick)."""
    if VARIABLE in environ:
        return environ[VARIABLE]
    if (machine or platform.machine()).lower() not in ("x86_64", "amd64"):
        return None
    if not {"avx2", "fma"} <= (cpu_flags() if flags is None else flags):
        return None
    environ[VARIABLE] = PINNED
    return PINNED


def in_effect() -> str:
    """The capability torch's CPU kernels run with in this process (e.g. AVX2, AVX512, DEFAULT); fixes it if no kernel
    has run yet."""
    import torch

    return torch.backends.cpu.get_cpu_capability()


_OWN_PICK: list[int] = []  # torch's thread count before the first pin_threads: what `threads: 0` restores


def pin_threads(threads: int) -> int:
    """Set torch's intra-op CPU threads for this process to `threads` (`model.threads`), or back to torch's own pick
    (one per physical core, unless OMP_NUM_THREADS says fewer) for 0. The same count gives the same sums on any
    number of cores (more threads than cores: slower, same bytes). Returns the count in effect."""
    import torch

    if not _OWN_PICK:
        _OWN_PICK.append(torch.get_num_threads())
    torch.set_num_threads(threads or _OWN_PICK[0])
    return torch.get_num_threads()
