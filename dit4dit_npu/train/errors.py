"""The training error a user gets as one line (exit code 2, ``dit4dit_npu.console``) rather than a traceback."""

from __future__ import annotations

from dit4dit_npu.errors import DiT4DiTError


class TrainingError(DiT4DiTError, RuntimeError):
    """A training problem with a one-line, user-facing message."""
