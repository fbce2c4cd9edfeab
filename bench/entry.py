"""The benchmarks' entry point: a setting, an option or an input a script refuses ends it in one line naming the
problem, exit code 2, as the stages and `ragen` commands end, instead of a traceback whose last line says it.

Each script ends with `if __name__ == "__main__": from entry import run_main; run_main(main, __file__)`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable


def input_errors() -> tuple[type[BaseException], ...]:
    """What a bad input raises: the config's, a file's a stage wrote, a missing file, and a model path's (when the
    script loaded the model code: importing it here would cost the env-only benchmarks seconds of start-up)."""
    from ragen.config import ConfigError
    from ragen.fileio import StageFileError

    model = sys.modules.get("ragen.policy.model")
    return (ConfigError, StageFileError, FileNotFoundError, *((model.ModelLoadError,) if model else ()))


def run_main(main: Callable[[], int | None], script: str) -> None:
    """Run a benchmark's `main` and exit with its code (None: 0), or with 2 after one line for a bad input."""
    try:
        code = main()
    except Exception as error:
        if not isinstance(error, input_errors()):
            raise
        print(f"{Path(script).name}: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    raise SystemExit(code)
