"""ragen: a faithful, reproducible re-implementation of RAGEN (StarPO / StarPO-S, arXiv 2504.20073)."""

__version__ = "0.1.0"
