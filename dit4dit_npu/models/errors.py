"""The one error a model module raises for a config value it cannot use.

Modules know only their own model-local config (``BackboneConfig``, ``ActionHeadConfig``, ...), so
their messages name a model-local field. ``build.py`` is the one place that knows which run-config
key filled that field, and re-raises the problem as a ``ConfigError`` naming the key the user set.
"""

from __future__ import annotations

from dit4dit_npu.errors import DiT4DiTError


class ModelConfigError(DiT4DiTError, ValueError):
    """``field``: the model-local field at fault (e.g. ``extract_layer``); ``detail``: what was expected."""

    def __init__(self, field: str, detail: str) -> None:
        super().__init__(f"{field}: {detail}")
        self.field = field
        self.detail = detail
