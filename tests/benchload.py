"""Load a script of bench/ as a module, as when it runs from bench/: its imports of sibling scripts resolve."""

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).parents[1] / "bench"


def load_bench(name: str) -> ModuleType:
    """bench/<name>.py as module `name` (bench/ joins sys.path once, for the scripts' sibling imports)."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module
