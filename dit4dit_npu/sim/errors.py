"""The one error type of the simulation package: bad input or an environment that cannot run.

The command-line tools print its message as a single line and exit with code 2; nothing is
written when it is raised before the first episode.
"""

from __future__ import annotations

from dit4dit_npu.errors import DiT4DiTError


class SimError(DiT4DiTError, RuntimeError):
    """Unknown task, mismatched policy, unreachable server, renderer that cannot start, ..."""


class EpisodeError(DiT4DiTError, RuntimeError):
    """This episode cannot go on (non-finite action, diverged physics): it counts as a failure
    and the evaluation continues with the next one."""
