"""What the client checks on each side of the wire: requests before they are sent, replies
before they are returned.

A reply from ``infer()`` goes straight to a robot, so one without ``actions``, of another shape
than the server announced, or with NaN/inf is refused here (``BadReplyError``) rather than left for
the robot code to trip over (a ``KeyError``, or a NaN command). A request the server would refuse
anyway, or that msgpack cannot carry at all, is refused before it is sent, naming the key
(``RequestError``). The robot loop's own arguments (a control rate within the server's bounds,
integer step counts) are checked with the same rules where they are given (``ArgumentError``).
numpy only.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dit4dit_client import msgpack_numpy
from dit4dit_client.errors import ArgumentError, BadReplyError, RequestError

SEED_LIMIT = 2**63  # the server's (and torch's) seed range is [0, 2**63)
# The robot control rates the policy server accepts (its rtc.control_hz: > 0 and at most this): it
# estimates a chunk's inference delay as latency x rate, and a loop faster than 1 kHz does not
# execute action chunks. The client's loops take the same bounds.
MAX_CONTROL_HZ = 1000.0
_NUMERIC = "fiu"  # float, int, unsigned dtype kinds; bool, str, bytes are not actions


def check_seed(value: Any, key: str = "seed") -> None:
    """None, or an int in [0, 2**63): the same rule and wording as the server's."""
    if value is None:
        return
    if isinstance(value, bool | np.bool_) or not isinstance(value, int | np.integer):
        raise RequestError(f"{key}: expected an int in [0, 2**63), got {type(value).__name__} {value!r:.60}")
    if not 0 <= int(value) < SEED_LIMIT:
        raise RequestError(f"{key}: {int(value)} is out of range, expected an int in [0, 2**63)")


def check_control_hz(value: Any, key: str = "control_hz") -> float:
    """A robot control rate in Hz within the server's bounds, (0, MAX_CONTROL_HZ], as a float: the
    server's rule for its rtc.control_hz, type included (a Python int or float, not a bool)."""
    if isinstance(value, bool) or not isinstance(value, int | float):  # numpy's float32, a str, ...
        raise ArgumentError(
            f"{key}: expected the robot's control rate in Hz as a Python int or float (the policy server "
            f"takes no other type; float(x) converts numpy's), got {type(value).__name__} {value!r:.40}"
        )
    if not 0 < value <= MAX_CONTROL_HZ:
        raise ArgumentError(
            f"{key}: expected the robot's control rate in Hz, > 0 and at most {MAX_CONTROL_HZ:g} (the policy "
            f"server's bounds: faster loops than that do not execute action chunks), got {value!r:.40}"
        )
    return float(value)


def check_count(value: Any, key: str, low: int, hint: str = "") -> int:
    """A count of control steps: an int (numpy's too, never a bool) >= low. ``hint``: what else the
    argument takes, said in the message (e.g. " (or None: whole chunks)")."""
    if isinstance(value, bool | np.bool_) or not isinstance(value, int | np.integer):
        raise ArgumentError(f"{key}: expected an int >= {low}{hint}, got {type(value).__name__} {value!r:.40}")
    if value < low:
        raise ArgumentError(f"{key}: expected >= {low}{hint}, got {value}")
    return int(value)


def pack_request(msg: dict[str, Any]) -> bytes:
    """The request's bytes, or one line naming the first key whose value msgpack cannot carry."""
    try:
        return msgpack_numpy.packb(msg)
    except (TypeError, ValueError, OverflowError) as e:  # a set; an int past 64 bits; an object array
        where, value = _culprit(msg, "")
        raise RequestError(
            f"{where or 'request'}: a value of type {type(value).__name__} cannot be sent ({e}); msgpack carries None, bool, "
            "int in [-2**63, 2**64), float, str, bytes, lists, dicts and numeric numpy arrays"
        ) from None


def _culprit(value: Any, path: str) -> tuple[str, Any]:
    """The innermost value under ``value`` that does not pack, and its key path (``images['cam']``)."""
    if isinstance(value, dict):
        items: Any = value.items()
    elif isinstance(value, list | tuple):
        items = enumerate(value)
    else:
        return path, value
    for k, v in items:
        try:
            msgpack_numpy.packb(v)
        except (TypeError, ValueError, OverflowError):
            return _culprit(v, f"{path}[{k!r}]" if path else str(k))
    return path, value  # every value packs: a key does not


def check_metadata(meta: dict[str, Any], server: str) -> tuple[int, ...] | None:
    """The metadata's ``action_shape`` (None when the server sends none, as openpi's do)."""
    shape = meta.get("action_shape")
    if shape is None:
        return None
    if not isinstance(shape, list | tuple) or not shape or not all(
        isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in shape
    ):
        raise BadReplyError(f"{server}: metadata action_shape {shape!r:.80} is not a list of positive ints")
    return tuple(shape)


def check_actions(reply: dict[str, Any], server: str, action_shape: tuple[int, ...] | None) -> None:
    """An observation's reply: ``actions`` present, numeric, of the announced shape (a leading batch
    axis allowed), every value finite."""
    if "actions" not in reply:
        raise BadReplyError(f"{server}: reply without 'actions' (keys {sorted(map(str, reply))[:8]}); nothing to execute")
    actions = reply["actions"]
    _check_array(actions, "actions", server)
    if action_shape is not None and actions.shape not in (action_shape, actions.shape[:1] + action_shape):
        raise BadReplyError(
            f"{server}: 'actions' of shape {actions.shape}, expected {action_shape} (the metadata's action_shape) "
            "or that with a leading batch axis"
        )
    _check_finite(actions, "actions", server)


def check_ack(reply: dict[str, Any], server: str, ctrl: Any, expected: str | None = None) -> None:
    """The acknowledgement of an openpi ``{"__ctrl__": ctrl}`` message (``expected``: its value)."""
    ack = reply.get("__ack__")
    if not isinstance(ack, str) or (expected is not None and ack != expected):
        raise BadReplyError(
            f"{server}: expected the acknowledgement {{'__ack__': {expected or ctrl!r}}} of {{'__ctrl__': {ctrl!r}}}, "
            f"got {reply!r:.120}"
        )


def check_normalized(reply: dict[str, Any], server: str, request_id: str, rows: int, chunk_length: Any) -> np.ndarray:
    """DiT4DiT's inference envelope: this request's id, ``data.normalized_actions`` numeric (B, chunk,
    width) with B the examples sent and chunk the metadata's ``chunk_length`` (when it says), finite."""
    if reply.get("request_id", request_id) != request_id:
        raise BadReplyError(f"{server}: reply for request_id {reply.get('request_id')!r}, sent {request_id!r}")
    data = reply.get("data")
    if not isinstance(data, dict) or "normalized_actions" not in data:
        raise BadReplyError(f"{server}: reply without data.normalized_actions (keys {sorted(map(str, reply))[:8]})")
    actions = data["normalized_actions"]
    _check_array(actions, "normalized_actions", server)
    chunk = chunk_length if isinstance(chunk_length, int) and not isinstance(chunk_length, bool) else None
    if actions.ndim != 3 or actions.shape[0] != rows or (chunk is not None and actions.shape[1] != chunk):
        want = f"({rows}, {chunk if chunk is not None else 'chunk'}, action_width)"
        raise BadReplyError(f"{server}: normalized_actions of shape {actions.shape}, expected {want}")
    _check_finite(actions, "normalized_actions", server)
    return actions


def _check_array(value: Any, key: str, server: str) -> None:
    if not isinstance(value, np.ndarray) or value.dtype.kind not in _NUMERIC:
        got = f"an array of {value.dtype}" if isinstance(value, np.ndarray) else f"a {type(value).__name__}"
        raise BadReplyError(f"{server}: '{key}' is {got}, expected a numeric numpy array")


def _check_finite(actions: np.ndarray, key: str, server: str) -> None:
    bad = int(actions.size - np.count_nonzero(np.isfinite(actions)))
    if bad:
        raise BadReplyError(
            f"{server}: {bad} NaN/inf value(s) in '{key}' of shape {actions.shape}; refusing the whole chunk"
        )
