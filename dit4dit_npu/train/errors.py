"""The training errors a user gets as one line (exit code 2) rather than a traceback."""

from __future__ import annotations


class TrainingError(RuntimeError):
    """A training problem with a one-line, user-facing message."""


def user_errors() -> tuple[type[Exception], ...]:
    """Errors that mean bad input (config, data, base model, launch), not a bug."""
    from dit4dit_npu import device
    from dit4dit_npu.batch import BatchError
    from dit4dit_npu.config import ConfigError
    from dit4dit_npu.data import DatasetError
    from dit4dit_npu.models import FrameInputError, PromptCacheError
    from dit4dit_npu.transforms import PolicyIOError

    return (
        ConfigError, TrainingError, device.DeviceError, DatasetError, BatchError, FrameInputError,
        PromptCacheError, PolicyIOError,
    )
