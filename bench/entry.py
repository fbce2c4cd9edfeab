"""The benchmarks' entry point: a setting, an option or an input a script refuses ends it in one line naming the
problem, exit code 2, as the stages end (the errors of `flows.common.stage_input_errors`), instead of a traceback
whose last line says it.

Each script ends with `if __name__ == "__main__": from entry import run_main; run_main(main, __file__)`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable


def run_main(main: Callable[[], int | None], script: str) -> None:
    """Run a benchmark's `main` and exit with its code (None: 0), or with 2 after one line for a bad input."""
    try:
        code = main()
    except Exception as error:
        from flows.common import stage_input_errors  # here: an env benchmark skips the model code's import

        if not isinstance(error, stage_input_errors()):
            raise
        print(f"{Path(script).name}: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    raise SystemExit(code)
