"""dit4dit-npu: NPU-first DiT4DiT (Cosmos-Predict2.5 video features + flow-matching action head).

``import dit4dit_npu`` stays light (no torch): ``DiT4DiTPolicy`` is imported on first use, so a
robot-side process can use ``dit4dit_npu.serve.client`` without the training stack.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dit4dit_npu.policy import DiT4DiTPolicy

__all__ = ["DiT4DiTPolicy"]


def __getattr__(name: str) -> Any:
    if name == "DiT4DiTPolicy":
        from dit4dit_npu.policy import DiT4DiTPolicy

        return DiT4DiTPolicy
    raise AttributeError(f"module 'dit4dit_npu' has no attribute {name!r}")
