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
