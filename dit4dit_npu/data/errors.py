"""The one exception type of the data layer.

Every problem with a dataset on disk (missing or malformed metadata, unknown format version,
missing/truncated video, absent camera key, dimension mismatch with the config, NaN values,
timestamps off the fps grid) is raised as a ``DatasetError`` whose message names the file or key
and what was expected, so a user can fix the data without reading a traceback.
"""

from __future__ import annotations

from dit4dit_npu.errors import DiT4DiTError


class DatasetError(DiT4DiTError, ValueError):
    """A dataset problem with a one-line, user-facing message naming the file/key at fault."""


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
