"""The project's one base exception: ``DiT4DiTError`` is a problem with the user's input, files,
config or environment, never a bug.

Every error the project raises for a user to fix subclasses it, so a command-line entry point
needs to know only this one type (``dit4dit_npu.console.run`` prints it as one line and exits with
code 2), while a bug (any other exception) keeps its traceback. Subclasses keep a builtin base too
(``ValueError`` for bad values, ``RuntimeError`` for states), so callers that catch those still work.
Its message is one line meant for the user: it names the file, key or flag at fault and what was
expected.

A leaf module (nothing from the project imported): models/, data/ and config/ can all depend
on it. The robot-side client package (``client/``) cannot, since it installs alone: its errors
subclass ``dit4dit_client.errors.ClientError``, which ``dit4dit_npu.console`` treats the same way.
``ConfigError`` lives here because the run config validates its sections next to their
declarations (``config/schema.py``, ``config/framework.py``, ``config/datasets.py``) and the models, which never import the
config layer, raise it too when what they are built with does not fit (a width, a depth), naming
the run-config key to change.
"""

from __future__ import annotations

from typing import Any


class DiT4DiTError(Exception):
    """A user-facing problem (input, files, config, environment); the message is one line."""

    cli_prefix = "error"  # what dit4dit_npu.console prints before the message; a subclass may name its kind


class ConfigError(DiT4DiTError, ValueError):
    """A config problem with a one-line, user-facing message naming the run-config key."""

    cli_prefix = "config error"


def require(ok: bool, key: str, value: Any, expected: str) -> None:
    """``ConfigError("<key>: got <value>, expected <expected>")`` unless ``ok``."""
    if not ok:
        raise ConfigError(f"{key}: got {value!r}, expected {expected}")


def unwrap_worker_error(e: Exception) -> Exception:
    """A user error raised in a DataLoader worker, with its one-line message back (the
    trainer's batch stream and the latent encoder both read through workers).

    torch re-raises it in the main process as the same type whose message is "Caught X in
    DataLoader worker process N." plus the worker's whole traceback; the original message is
    the traceback's last line, after the exception's qualified name.
    """
    text = str(e)
    if not text.startswith("Caught ") or "Original Traceback" not in text:
        return e
    last = text.rstrip().splitlines()[-1]
    for name in (f"{type(e).__module__}.{type(e).__qualname__}: ", f"{type(e).__name__}: "):
        if last.startswith(name):
            last = last[len(name) :]
            break
    try:
        return type(e)(last)
    except Exception:  # an exception type that takes other arguments: keep torch's
        return e


class DiT4DiTWarning(UserWarning):
    """The base of this project's warnings (a folder loaded unverified, an input acted on outside
    the training range): a command line prints each as one ``warning: ...`` line (console.py)."""
