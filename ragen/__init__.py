"""ragen: a faithful, reproducible re-implementation of RAGEN (StarPO / StarPO-S, arXiv 2504.20073)."""

from ragen.kernels import pin as _pin_cpu_kernels

_pin_cpu_kernels()  # before torch runs a kernel: AVX2 kernels on every x86 machine that has them (ragen/kernels.py)

__version__ = "0.1.0"
