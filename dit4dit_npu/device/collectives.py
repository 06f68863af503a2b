"""How a collective that another rank never joined fails, per backend.

A rank waiting in an all-reduce or a barrier learns of a dead or stalled peer only through the
backend's own error, and each backend says it its own way: gloo raises a plain ``RuntimeError``
whose text is all there is ("Timed out waiting 10000ms for recv operation", "Connection reset by
peer", "Connection closed by peer"); nccl and hccl raise ``torch.distributed.DistBackendError`` from
Python, though their watchdogs usually abort the process first, printing the collective that
timed out (its op type and sequence number) themselves. This module tells those errors from any
other, so the trainer can stop with one line naming the wait instead of a traceback.
"""

from __future__ import annotations

from typing import Literal

CollectiveFailure = Literal["timeout", "peer lost"]

# Texts of gloo's transport errors (third_party/gloo/gloo/transport/tcp: the first three, seen on a
# stalled and on a killed peer) and of the NCCL/HCCL process groups' aborts.
_TIMEOUT_TEXTS = ("timed out waiting", "application timeout caused pair closure", "watchdog caught collective",
                  "collective operation timeout")
_PEER_LOST_TEXTS = ("connection reset by peer", "connection closed by peer", "broken pipe", "communicator was aborted",
                    "gloo/transport")


def collective_failure(e: BaseException) -> CollectiveFailure | None:
    """``"timeout"`` (this rank waited out the process group's timeout), ``"peer lost"`` (a peer's
    connection closed: it died), or None for any other error (a bug, a user error: left as it is)."""
    text = str(e).lower()
    if any(t in text for t in _TIMEOUT_TEXTS):
        return "timeout"
    if any(t in text for t in _PEER_LOST_TEXTS):
        return "peer lost"
    try:
        from torch.distributed import DistBackendError
    except ImportError:  # a torch without the distributed package: nothing failed in a collective
        return None
    return "peer lost" if isinstance(e, DistBackendError) else None
