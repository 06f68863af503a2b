"""The one wrapper every command-line entry point's ``main`` goes through.

    @entry_point
    def main(argv: list[str] | None = None) -> int: ...

A problem the user can fix (a ``DiT4DiTError``: bad input, files, config, environment) or a full
disk becomes exactly one line on stderr, ``error: <message>`` (``config error: <message>`` for a
``ConfigError``), and exit code 2, with no traceback; Ctrl-C exits with 130 quietly. Any other
exception is a bug and keeps its traceback. argparse's own usage errors (also exit code 2) pass
through unchanged.

Light on purpose (no torch): a command fails fast on its arguments and config before the heavy
imports happen.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable

from dit4dit_npu.errors import DiT4DiTError, unwrap_worker_error
from dit4dit_npu.files import is_out_of_space

EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for Ctrl-C


def error_line(e: BaseException) -> str:
    """The one line a user sees for ``e``: its kind's prefix and its message, whitespace folded
    (a problem raised in a DataLoader worker gets its own message back, not torch's traceback)."""
    if isinstance(e, DiT4DiTError):
        e = unwrap_worker_error(e)
    text = " ".join(str(e).split()) or type(e).__name__
    if isinstance(e, DiT4DiTError):
        return f"{e.cli_prefix}: {text}"
    return f"error: no space left: {text}"


def run(command: Callable[[], int | None]) -> int:
    """Run ``command`` (a CLI's body) and return its exit code, user errors as one line (code 2)."""
    try:
        code = command()
    except DiT4DiTError as e:
        print(error_line(e), file=sys.stderr)
        return EXIT_USER_ERROR
    except OSError as e:
        if not is_out_of_space(e):
            raise
        print(error_line(e), file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    return 0 if code is None else code


def entry_point(main: Callable[..., int | None]) -> Callable[..., int]:
    """Decorate a ``main(argv=None)`` so that calling it (console script, ``python -m``, a test)
    goes through ``run``."""

    @functools.wraps(main)
    def wrapped(argv: list[str] | None = None) -> int:
        return run(lambda: main(argv))

    return wrapped
