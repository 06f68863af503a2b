"""One-line errors and the shared flags: the bottom-row helpers every command-line entry point uses.

    @entry_point
    def main(argv: list[str] | None = None) -> int: ...

A problem the user can fix (a ``DiT4DiTError``: bad input, files, config, environment; or the
client package's ``ClientError``: a malformed message, a request a server refused) or a full
disk (an ``OSError``, or a writer's own error type for it, e.g. safetensors') becomes exactly one
line on stderr, ``error: <message>`` (``config error: <message>`` for a
``ConfigError``), and exit code 2, with no traceback; Ctrl-C exits with 130 quietly. Any other
exception is a bug and keeps its traceback. argparse's own usage errors (also exit code 2) pass
through unchanged.

Light on purpose (no torch): a command fails fast on its arguments and config before the heavy
imports happen.
"""

from __future__ import annotations

import argparse
import functools
import sys
import warnings
from collections.abc import Callable
from typing import Any

from dit4dit_npu.errors import DiT4DiTError, DiT4DiTWarning, unwrap_worker_error
from dit4dit_npu.files import is_out_of_space

_default_showwarning = warnings.showwarning
EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for Ctrl-C


def user_errors() -> tuple[type[BaseException], ...]:
    """DiT4DiTError, and the robot-side client package's own base (it installs without this
    package) once it is imported: a ClientError cannot exist before. Not imported here, so this
    module stays importable from the source tree before anything is installed (setup_env.sh runs
    ``python -m dit4dit_npu.doctor --stack`` then)."""
    client = sys.modules.get("dit4dit_client.errors")
    return (DiT4DiTError,) if client is None else (DiT4DiTError, client.ClientError)


def error_line(e: BaseException) -> str:
    """The one line a user sees for ``e``: its kind's prefix and its message, whitespace folded
    (a problem raised in a DataLoader worker gets its own message back, not torch's traceback)."""
    if isinstance(e, DiT4DiTError):
        e = unwrap_worker_error(e)
    text = " ".join(str(e).split()) or type(e).__name__
    if isinstance(e, user_errors()):
        return f"{getattr(e, 'cli_prefix', 'error')}: {text}"
    return f"error: no space left: {text}"


def run(command: Callable[[], int | None]) -> int:
    """Run ``command`` (a CLI's body) and return its exit code, user errors as one line (code 2)."""
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _one_line_warning  # restored when the block ends
            code = command()
    except user_errors() as e:
        print(error_line(e), file=sys.stderr)
        return EXIT_USER_ERROR
    except Exception as e:  # a full disk is the user's to fix, whatever type the writer raised it as
        if not is_out_of_space(e):
            raise
        print(error_line(e), file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    return 0 if code is None else code


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Our own warnings as one line, ``warning: <message>`` (Python's default adds the source line
    that raised it); anything else as Python prints it."""
    if issubclass(category, DiT4DiTWarning):
        print(f"warning: {' '.join(str(message).split())}", file=sys.stderr if file is None else file)
    else:
        _default_showwarning(message, category, filename, lineno, file, line)


def entry_point(main: Callable[..., int | None]) -> Callable[..., int]:
    """Decorate a ``main(argv=None)`` so that calling it (console script, ``python -m``, a test)
    goes through ``run``."""

    @functools.wraps(main)
    def wrapped(argv: list[str] | None = None) -> int:
        return run(lambda: main(argv))

    return wrapped


# --------------------------------------------------------------------------------------------
# Flags: one name per concept across the commands
# --------------------------------------------------------------------------------------------
# --policy DIR      a policy folder (eval, serve, sim.eval); --checkpoint only for an original
#                   DiT4DiT checkpoint file (convert)
# --out DIR         the folder a command writes (data.demo, encode_latents, convert, eval, sim.*)
# --episodes N      how many episodes (data.demo, sim.*); --episode-indices I [I ...] which ones (eval)
# --size HxW        camera frame size (data.demo, sim.*)
# --compile         torch.compile the policy's backbone blocks (serve, eval, sim.eval; declared
#                   once: add_compile_flag); training's switch is the config key trainer.compile
# A renamed flag keeps its former spelling as a hidden alias that says once that it was renamed.


class _FormerName(argparse.Action):
    def __init__(self, option_strings: list[str], dest: str, new: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.new = new

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        print(f"notice: {option_string} is deprecated, use {self.new}", file=sys.stderr)
        setattr(namespace, self.dest, self.const if self.nargs == 0 else values)  # a switch: its value


def former_names(parser: argparse.ArgumentParser, action: argparse.Action, *names: str) -> None:
    """Accept ``names``, the former spellings of ``action``'s flag, hidden from ``--help``: each sets
    the same value and prints one notice line, so scripts written for the old name keep working.
    A required flag is declared ``required=False`` and checked with ``require`` after parsing."""
    for name in names:
        parser.add_argument(
            name, dest=action.dest, nargs=action.nargs, type=action.type, metavar=action.metavar,
            const=action.const, default=argparse.SUPPRESS, help=argparse.SUPPRESS, action=_FormerName,
            new=action.option_strings[0],
        )


def require(parser: argparse.ArgumentParser, args: argparse.Namespace, *actions: argparse.Action) -> None:
    """argparse's own "required" error for flags that have former names (``former_names``)."""
    missing = [a.option_strings[0] for a in actions if getattr(args, a.dest, None) is None]
    if missing:
        parser.error(f"the following arguments are required: {', '.join(missing)}")


def add_compile_flag(parser: argparse.ArgumentParser) -> None:
    """``--compile``: the same switch as ``DiT4DiTPolicy.from_pretrained(compile=True)`` in every
    command that loads a policy (``args.compile``)."""
    parser.add_argument(
        "--compile", action="store_true",
        help="torch.compile each transformer block of the video backbone (the same actions; the first calls, and the "
        "first at a new batch size, are slower while it compiles; refused on Ascend NPU)",
    )


def size_hw(text: str, flag: str = "--size") -> tuple[int, int]:
    """``--size HxW`` (e.g. 240x320) -> (H, W); the command checks the values it can use."""
    try:
        h, w = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise DiT4DiTError(f"{flag}: expected HxW such as 240x320, got {text!r}") from None
    return h, w
