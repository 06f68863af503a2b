"""The doctor's host checks (torch imported, through the device layer): visible cards vs the
processes a launch will start, a tiny training step on each card, fused attention, a real
all-reduce over the launch's backend, free card memory against a planned number of bytes.

The probes that run on the cards are the device layer's (``device/probes.py``: the only code
that knows the devices); tests drive these checks on a simulated host by substituting probe
results there, as ``tests/test_device.py`` simulates NPU/CUDA hosts. Importing this module
imports no torch.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from dit4dit_npu.device import probes
from dit4dit_npu.device.probes import CheckFailed, first_line
from dit4dit_npu.doctor.results import FAIL, PASS, SKIP, WARN, Result

# The plan (dit4dit-memory-plan) leaves out the runtime's own reserve and allocator fragmentation.
MEMORY_HEADROOM_BYTES = 4 * 2**30


def host_checks(num_processes: int | None, timeout_s: float) -> Iterator[Result]:
    from dit4dit_npu.device import api

    kind = api.device_type()
    n = num_processes or (2 if kind == api.CPU else api.device_count())
    yield check_cards(n)
    yield _guarded("attention", probes.fused_attention)
    yield check_step(n)
    yield check_collective(n, timeout_s)


def _guarded(name: str, probe) -> Result:
    try:
        status, detail = probe()
    except Exception as e:  # a probe that crashed is that check's FAIL, never the doctor's
        return Result(FAIL, name, first_line(e))
    return Result(status, name, detail)


def check_cards(n: int) -> Result:
    from dit4dit_npu.device import api, launch

    kind = api.device_type()
    if kind == api.CPU:
        warning = launch.check_local_ranks(n)
        if warning:
            return Result(WARN, "cards", warning.removeprefix("warning: "))
        return Result(SKIP, "cards", f"CPU host: {n} process(es) per node on {launch.cpu_cores()} core(s), no cards")
    try:
        launch.check_local_ranks(n)
    except api.DeviceError as e:
        return Result(FAIL, "cards", str(e))
    cards = api.device_count()
    var = launch.VISIBLE_DEVICES[kind]
    visible = f"{var}={os.environ[var]}" if var in os.environ else f"{var} unset: all cards"
    idle = f"; {cards - n} card(s) idle" if n < cards else ""
    return Result(PASS, "cards", f"{cards} visible {kind} card(s) ({visible}) for {n} process(es) per node{idle}")


def check_step(n: int) -> Result:
    """A tiny forward + backward + AdamW step under bf16 autocast on each card a rank will use."""
    from dit4dit_npu.device import api

    kind = api.device_type()
    indices = [0] if kind == api.CPU else list(range(min(n, api.device_count())))
    for i in indices:
        try:
            probes.tiny_step(i)
        except Exception as e:
            where = api.CPU if kind == api.CPU else f"{kind}:{i}"
            return Result(FAIL, "step", f"{where}: {first_line(e)}")
    optimizer = "fused AdamW" if api.supports_fused_adamw() else "AdamW (foreach; fused on cards only)"
    cards = "cpu" if kind == api.CPU else f"{len(indices)} {kind} card(s)"
    return Result(PASS, "step", f"{cards}: forward + backward + {optimizer} under bf16 autocast, finite and updated")


def check_collective(n: int, timeout_s: float) -> Result:
    from dit4dit_npu.device import api

    backend = api.dist_backend()
    where = f"{n} CPU process(es)" if api.device_type() == api.CPU else f"{n} {api.device_type()} card(s)"
    try:
        seconds = probes.all_reduce(n, backend, timeout_s)
    except CheckFailed as e:
        return Result(FAIL, "collective", f"all-reduce over {backend} across {where}: {e}")
    return Result(PASS, "collective", f"all-reduce over {backend} across {where} ({seconds:.1f} s; this node only)")


def check_memory(planned_bytes: float, n: int, plan: str) -> Result:
    """Free memory of every card a rank will use against ``planned_bytes`` per card (``plan`` says
    where the number comes from)."""
    from dit4dit_npu.device import api

    kind = api.device_type()
    if kind == api.CPU:
        return Result(SKIP, "memory", f"CPU host: no card memory (plan: {planned_bytes / 2**30:.1f} GiB per process)")
    free = {i: api.memory_info(i) for i in range(min(n, api.device_count()))}
    tightest = min(free, key=lambda i: free[i][0])
    have, total = free[tightest]
    need = planned_bytes / 2**30
    summary = f"{plan}: {need:.1f} GiB per card; {kind}:{tightest} has {have / 2**30:.1f} of {total / 2**30:.1f} GiB free"
    if planned_bytes > have:
        return Result(FAIL, "memory", f"{summary}: does not fit (enable gradient checkpointing, lower the batch, "
                                      "or free the card)")
    if have - planned_bytes < MEMORY_HEADROOM_BYTES:
        return Result(WARN, "memory", f"{summary}: less than {MEMORY_HEADROOM_BYTES / 2**30:.0f} GiB to spare for the "
                                      "runtime's reserve and fragmentation")
    return Result(PASS, "memory", summary)
