"""Wire codec: openpi's exact layout, round trips, and refusal of what must never be decoded."""

from __future__ import annotations

import subprocess
import sys

import msgpack
import numpy as np
import pytest
from dit4dit_client import msgpack_numpy as mn


@pytest.mark.parametrize(
    "arr",
    [
        np.arange(24, dtype=np.float32).reshape(2, 3, 4),
        np.zeros((0, 5), dtype=np.int64),
        np.random.default_rng(0).integers(0, 255, (8, 6, 3), dtype=np.uint8),
        np.array([True, False]),
        np.asfortranarray(np.arange(6, dtype=np.float64).reshape(2, 3)),  # non-C layout
        np.arange(10, dtype=np.int16)[::2],  # non-contiguous view
        np.array(["ab", "c"]),  # fixed-width unicode is plain bytes, fine
    ],
)
def test_array_round_trip(arr: np.ndarray) -> None:
    out = mn.unpackb(mn.packb({"x": arr, "nested": [arr, {"y": arr}]}))
    for got in (out["x"], out["nested"][0], out["nested"][1]["y"]):
        assert got.dtype == arr.dtype and got.shape == arr.shape
        np.testing.assert_array_equal(got, arr)


def test_scalars_and_plain_values() -> None:
    msg = {"f": np.float32(1.5), "i": np.int64(-3), "b": np.bool_(True), "s": "text", "n": None, "l": [1, 2.0]}
    out = mn.unpackb(mn.packb(msg))
    assert out["f"] == np.float32(1.5) and isinstance(out["f"], np.float32)
    assert out["i"] == -3 and isinstance(out["i"], np.int64)
    assert out["b"] is np.True_ or out["b"] == np.True_
    assert out["s"] == "text" and out["n"] is None and out["l"] == [1, 2.0]


def test_layout_is_openpi() -> None:
    """The bytes on the wire are what openpi_client.msgpack_numpy produces and expects."""
    arr = np.arange(6, dtype="<f4").reshape(2, 3)
    raw = msgpack.unpackb(mn.packb(arr))
    assert raw == {b"__ndarray__": True, b"data": arr.tobytes(), b"dtype": "<f4", b"shape": [2, 3]}
    raw = msgpack.unpackb(mn.packb(np.int32(7)))
    assert raw == {b"__npgeneric__": True, b"data": 7, b"dtype": "<i4"}
    # ...and a message written the way openpi writes it (shape as a tuple) decodes here.
    openpi_msg = msgpack.packb(
        {"img": {b"__ndarray__": True, b"data": bytes(12), b"dtype": "|u1", b"shape": (2, 2, 3)}}
    )
    got = mn.unpackb(openpi_msg)["img"]
    assert got.dtype == np.uint8 and got.shape == (2, 2, 3)


@pytest.mark.parametrize(
    "arr", [np.array([object()], dtype=object), np.zeros(2, dtype="V4"), np.zeros(2, dtype=np.complex64)]
)
def test_refuses_to_encode_unsafe_dtypes(arr: np.ndarray) -> None:
    with pytest.raises(mn.WireFormatError, match="unsupported dtype"):
        mn.packb(arr)


def _tagged(dtype: str, data: bytes, shape: list[int]) -> bytes:
    return msgpack.packb({b"__ndarray__": True, b"data": data, b"dtype": dtype, b"shape": shape})


@pytest.mark.parametrize(
    ("message", "match"),
    [
        (_tagged("|O", bytes(8), [1]), "unsupported dtype"),
        (_tagged("|V4", bytes(4), [1]), "unsupported dtype"),
        (_tagged("<c8", bytes(8), [1]), "unsupported dtype"),
        (_tagged("not-a-dtype", bytes(4), [1]), "unknown dtype"),
        (_tagged("<f4", bytes(7), [2]), "7 bytes"),  # truncated
        (_tagged("<f4", bytes(8), [-1, -2]), "non-negative"),
        # A hostile shape whose int64 product would wrap around to the byte count.
        (_tagged("|u1", bytes(4), [2**62, 4, 4]), "bytes for shape"),
        (msgpack.packb({b"__ndarray__": True, b"data": "str", b"dtype": "<f4", b"shape": [1]}), "bytes"),
        (b"\xc1", "malformed msgpack"),  # reserved byte, never valid
        (msgpack.packb(1) + b"\x00", "malformed msgpack"),  # trailing data
        (b"", "malformed msgpack"),
    ],
)
def test_rejects_malformed_messages(message: bytes, match: str) -> None:
    with pytest.raises(mn.WireFormatError, match=match):
        mn.unpackb(message)


def test_decoded_arrays_are_read_only_views() -> None:
    # Zero-copy decode: consumers that need to write must copy (the policy does).
    out = mn.unpackb(mn.packb(np.ones(3, dtype=np.float32)))
    assert not out.flags.writeable


def test_client_modules_do_not_import_torch() -> None:
    code = "import sys, dit4dit_npu, dit4dit_npu.serve.client, dit4dit_client.msgpack_numpy; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
