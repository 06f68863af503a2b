"""The client package's one base exception.

``ClientError`` is a problem a user fixes (a malformed message, a request the server refused),
never a bug; its message is one line. It cannot subclass ``dit4dit_npu.errors.DiT4DiTError``: this
package must install and import without dit4dit-npu (and its torch). ``dit4dit_npu.console`` treats
both bases as user errors (one line, exit code 2).
"""

from __future__ import annotations


class ClientError(Exception):
    """A user-facing problem on the robot side of the wire; the message is one line."""
