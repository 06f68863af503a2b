"""Errors a user sees as one line naming what to fix (no traceback needed).

A leaf module (no imports): the run config's sections are declared in ``config/schema.py`` and,
for the model's own sections, in ``models/configs.py``, which the schema imports. Both validate
next to their declarations and raise ``ConfigError``; living here, it can be raised from either
side without an import cycle.
"""

from __future__ import annotations

from typing import Any


class ConfigError(ValueError):
    """A config problem with a one-line, user-facing message (no traceback needed)."""


def require(ok: bool, key: str, value: Any, expected: str) -> None:
    """``ConfigError("<key>: got <value>, expected <expected>")`` unless ``ok``."""
    if not ok:
        raise ConfigError(f"{key}: got {value!r}, expected {expected}")
