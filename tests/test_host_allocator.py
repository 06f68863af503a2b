"""device.configure_host_allocator: glibc malloc thresholds on CPU hosts only, never over the user's
MALLOC_* settings, and a freed large buffer really stays in the heap (is not mapped in again)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dit4dit_npu import device

ROOT = Path(__file__).resolve().parents[1]
GLIBC = device.host._glibc_mallopt() is not None


@pytest.fixture
def host(monkeypatch):
    """Pretend to be a host of the given kind (device detection is cached per process)."""

    def use(kind: str) -> None:
        monkeypatch.setenv("DIT4DIT_DEVICE", kind)
        device.reset_cache()

    yield use
    device.reset_cache()


@pytest.mark.skipif(not GLIBC, reason="glibc only")
def test_cpu_host_gets_both_thresholds_unless_the_user_set_one(host):
    host("cpu")
    assert device.configure_host_allocator({}) == {"MALLOC_MMAP_THRESHOLD_": 32 * 2**20,
                                                   "MALLOC_TRIM_THRESHOLD_": 256 * 2**20}
    assert device.configure_host_allocator({"MALLOC_MMAP_THRESHOLD_": "131072"}) == {
        "MALLOC_TRIM_THRESHOLD_": 256 * 2**20}
    assert device.configure_host_allocator({"MALLOC_MMAP_THRESHOLD_": "1", "MALLOC_TRIM_THRESHOLD_": "1"}) == {}


@pytest.mark.parametrize("kind", ["npu", "cuda"])
def test_accelerator_hosts_are_left_alone(host, kind):
    host(kind)
    assert device.configure_host_allocator({}) == {}


# Where a freed 16 MiB buffer goes, read from glibc's own books (mallinfo2) in a fresh process
# (mallopt is process-wide): with glibc's defaults it is mmap-ed and unmapped again on free (the
# next step page-faults it in anew); tuned, it comes from the heap and stays there once freed.
# How many page faults that saves per step is a measurement, not a unit test: bench/malloc.py
# (its --smoke run is in tests/test_bench_smoke.py).
WHERE_A_BUFFER_GOES = r"""
import ctypes, json, sys
from dit4dit_npu import device
applied = device.configure_host_allocator() if sys.argv[1] == "tuned" else {}
class MallInfo2(ctypes.Structure):
    _fields_ = [(f, ctypes.c_size_t) for f in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype, libc.malloc.restype = MallInfo2, ctypes.c_void_p
libc.malloc.argtypes = libc.free.argtypes = [ctypes.c_void_p]
size = 16 * 2**20
before = libc.mallinfo2()
buf = libc.malloc(size)
ctypes.memset(buf, 1, size)
held = libc.mallinfo2()
libc.free(buf)
after = libc.mallinfo2()
print(json.dumps({"applied": applied, "mmapped": held.hblkhd - before.hblkhd,
                  "free_in_heap": after.fordblks}))
"""


@pytest.mark.skipif(not GLIBC, reason="glibc only")
def test_tuned_malloc_keeps_a_freed_buffer_in_the_heap():
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    env.update(DIT4DIT_DEVICE="cpu", OMP_NUM_THREADS="1")
    runs = {}
    for mode in ("default", "tuned"):
        r = subprocess.run([sys.executable, "-c", WHERE_A_BUFFER_GOES, mode], env=env, cwd=ROOT,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr[-2000:]
        runs[mode] = json.loads(r.stdout.strip().splitlines()[-1])
    size = 16 * 2**20
    assert runs["default"]["mmapped"] >= size and runs["default"]["free_in_heap"] < size, runs
    assert runs["tuned"]["applied"], runs
    assert runs["tuned"]["mmapped"] == 0 and runs["tuned"]["free_in_heap"] >= size, runs
