"""The client package's one base exception and its kinds.

``ClientError`` is a problem a user fixes (a malformed message, a request the server refused, a
server that stopped answering), never a bug; its message is one line. It cannot subclass
``dit4dit_npu.errors.DiT4DiTError``: this package must install and import without dit4dit-npu
(and its torch). ``dit4dit_npu.console`` treats both bases as user errors (one line, exit code 2).
Each kind also subclasses the builtin a caller would catch (``TimeoutError``, ``ConnectionError``,
``ValueError``, ``TypeError``), so ``except`` clauses written against those keep working.
"""

from __future__ import annotations


class ClientError(Exception):
    """A user-facing problem on the robot side of the wire; the message is one line."""


class RequestError(ClientError, ValueError):
    """A request refused before it was sent (a seed out of range, a value msgpack cannot carry);
    the message names the key."""


class ArgumentError(ClientError, ValueError, TypeError):
    """An argument of a client object refused where it is given (a control rate outside the
    server's bounds, a step count that is not an int); the message names the argument. It is both
    builtins, so callers that caught the ValueError of a bad value, or the TypeError a float step
    count used to raise deep inside, keep working."""


class BadReplyError(ClientError, RuntimeError):
    """A reply the client will not hand to a robot (no actions, the wrong shape, NaN/inf); the
    message names the server and what is wrong."""


class ServerTimeoutError(ClientError, TimeoutError, RuntimeError):
    """No metadata within ``connect_timeout_s`` or no reply within the request timeout; the message
    names the server and the seconds. The connection is closed: a late reply would otherwise be
    read as the answer to the next request."""


class ConnectionLostError(ClientError, ConnectionError, RuntimeError):
    """The server closed the connection or went away (killed, keepalive pings unanswered)."""


class ServerUnreachableError(ClientError, ConnectionError, RuntimeError):
    """No policy server at the address: nothing listens there within ``connect_timeout_s``, or what
    answers is not a websocket server (an HTTP server or proxy refusing the upgrade)."""
