"""The project's one base exception: ``DiT4DiTError`` is a problem with the user's input, files,
config or environment, never a bug.

Every error the project raises for a user to fix subclasses it, so a command-line entry point
needs to know only this one type (``dit4dit_npu.cli.run_main`` prints it as one line and exits with
code 2), while a bug (any other exception) keeps its traceback. Subclasses keep a builtin base too
(``ValueError`` for bad values, ``RuntimeError`` for states), so callers that catch those still work.
Its message is one line meant for the user: it names the file, key or flag at fault and what was
expected.

Nothing here imports anything: models/, data/ and the robot-side client can all depend on it.
"""

from __future__ import annotations


class DiT4DiTError(Exception):
    """A user-facing problem (input, files, config, environment); the message is one line."""
