"""msgpack with numpy arrays: the openpi wire format, without pickle.

An ndarray travels as ``{b"__ndarray__": True, b"data": raw bytes, b"dtype": dtype.str,
b"shape": shape}`` and a numpy scalar as ``{b"__npgeneric__": True, b"data": item, b"dtype":
dtype.str}``, exactly as openpi's ``openpi_client.msgpack_numpy`` writes them, so an openpi client
can talk to our server and ours to theirs.

Object, void (structured) and complex dtypes are rejected in both directions: object arrays
cannot be sent as raw bytes without pickle, and the decoder must never build one from a
peer's bytes. Decoding also checks that the byte count matches dtype x shape, so a hostile or
truncated message becomes a ``WireFormatError`` (a ``ValueError``) instead of a numpy crash
deep in the policy.

This module imports only numpy and msgpack: robots use it through ``dit4dit_npu.serve.client``
without torch.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import msgpack
import numpy as np

from dit4dit_npu.errors import DiT4DiTError

__all__ = ["Packer", "WireFormatError", "pack_array", "packb", "unpack_array", "unpackb"]

_NDARRAY = b"__ndarray__"
_NPGENERIC = b"__npgeneric__"
# Kinds that cannot be represented as plain bytes (O), that carry arbitrary structure (V), or
# that no consumer here needs and openpi also refuses (c).
_REJECTED_KINDS = {"O": "object", "V": "void/structured", "c": "complex"}


class WireFormatError(DiT4DiTError, ValueError):
    """A message that cannot be encoded or decoded; the text says why."""


def _check_dtype(dtype: np.dtype) -> None:
    if dtype.kind in _REJECTED_KINDS:
        raise WireFormatError(f"unsupported dtype {dtype} ({_REJECTED_KINDS[dtype.kind]} arrays are not sent)")


def pack_array(obj: Any) -> Any:
    """msgpack ``default`` hook: ndarray / numpy scalar -> tagged dict; anything else passes."""
    if isinstance(obj, np.ndarray | np.generic):
        _check_dtype(obj.dtype)
    if isinstance(obj, np.ndarray):
        return {
            _NDARRAY: True,
            # tobytes() is C-ordered whatever the array's layout, matching the shape we send.
            b"data": obj.tobytes(),
            b"dtype": obj.dtype.str,
            b"shape": list(obj.shape),
        }
    if isinstance(obj, np.generic):
        return {_NPGENERIC: True, b"data": obj.item(), b"dtype": obj.dtype.str}
    return obj


def _decode_dtype(raw: Any) -> np.dtype:
    if isinstance(raw, bytes):
        raw = raw.decode("ascii", errors="replace")
    if not isinstance(raw, str):
        raise WireFormatError(f"malformed array: dtype must be a string, got {type(raw).__name__}")
    try:
        dtype = np.dtype(raw)
    except (TypeError, ValueError) as e:
        raise WireFormatError(f"malformed array: unknown dtype {raw!r}") from e
    _check_dtype(dtype)
    return dtype


def unpack_array(obj: dict) -> Any:
    """msgpack ``object_hook``: tagged dict -> ndarray / numpy scalar; other dicts pass."""
    if obj.get(_NDARRAY) is True:
        dtype = _decode_dtype(obj.get(b"dtype"))
        data, shape = obj.get(b"data"), obj.get(b"shape")
        if not isinstance(data, bytes):
            raise WireFormatError("malformed array: data must be bytes")
        if not isinstance(shape, list | tuple) or not all(
            isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape
        ):
            raise WireFormatError(f"malformed array: shape must be a list of non-negative ints, got {shape!r}")
        # Python ints: a hostile shape cannot overflow its way to a matching byte count.
        expected = math.prod(shape) * dtype.itemsize
        if expected != len(data):
            raise WireFormatError(
                f"malformed array: {len(data)} bytes for shape {tuple(shape)} of {dtype} "
                f"(expected {expected})"
            )
        # frombuffer gives a read-only view of the message bytes: no copy on the hot path.
        return np.frombuffer(data, dtype=dtype).reshape(shape)
    if obj.get(_NPGENERIC) is True:
        dtype = _decode_dtype(obj.get(b"dtype"))
        try:
            return dtype.type(obj.get(b"data"))
        except (TypeError, ValueError, OverflowError) as e:
            raise WireFormatError(f"malformed numpy scalar of dtype {dtype}: {e}") from e
    return obj


# Same names as openpi_client.msgpack_numpy, so code written against it reads the same here.
Packer = functools.partial(msgpack.Packer, default=pack_array)
packb = functools.partial(msgpack.packb, default=pack_array)


def unpackb(data: bytes, **kwargs: Any) -> Any:
    """Decode one message. Any malformation (bad msgpack, bad array) raises ``WireFormatError``."""
    try:
        return msgpack.unpackb(data, object_hook=unpack_array, **kwargs)
    except WireFormatError:
        raise
    except Exception as e:  # msgpack raises several unrelated types (ExtraData, FormatError, ...)
        detail = f": {e}" if str(e) else ""
        raise WireFormatError(f"malformed msgpack message ({type(e).__name__}{detail})") from e
