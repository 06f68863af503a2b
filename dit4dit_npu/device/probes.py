"""Probes the doctor runs on the cards (``dit4dit_npu/doctor/host.py`` turns them into checks):
a tiny training step, the fused attention kernel the model uses, a real all-reduce over the
launch's backend. Device-specific (torch_npu, SDPA kernels, collectives), so they live here in
the device layer; each raises ``CheckFailed`` with a one-line reason, or returns what it found.
"""

from __future__ import annotations

import multiprocessing
import os
import socket
import time

# The doctor's statuses (``doctor/results.py`` uses these): a probe that finds something short of a
# failure answers in them too (fused_attention).
PASS, WARN, FAIL, SKIP = "PASS", "WARN", "FAIL", "SKIP"


class CheckFailed(Exception):
    """A probe's one-line reason for a FAIL."""


def first_line(e: BaseException) -> str:
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return lines[0] if lines else type(e).__name__


def tiny_step(index: int) -> None:
    import torch

    from dit4dit_npu.device import api

    api.set_device(index)
    d = api.get_device(index)
    gen = torch.Generator().manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.GELU(), torch.nn.Linear(256, 16)).to(d)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True if api.supports_fused_adamw() else None)
    before = [p.detach().clone() for p in model.parameters()]
    x = torch.randn(32, 256, generator=gen).to(d)
    with api.autocast():
        y = model(x)
    if y.dtype != api.autocast_dtype():
        raise CheckFailed(f"autocast gave {y.dtype}, expected {api.autocast_dtype()}")
    loss = y.float().pow(2).mean()
    loss.backward()
    opt.step()
    api.synchronize()
    if not bool(torch.isfinite(loss).item()):
        raise CheckFailed(f"the loss is {loss.item()}")
    after = list(model.parameters())
    if not all(bool(torch.isfinite(p).all().item()) for p in after):
        raise CheckFailed("the optimizer step left non-finite weights")
    if all(torch.equal(a, b) for a, b in zip(before, after)):
        raise CheckFailed("the optimizer step changed no weight")


def fused_attention() -> tuple[str, str]:
    """Whether the fused attention kernel the model uses on this device runs: (status, detail)."""
    import torch

    from dit4dit_npu.device import api

    kind = api.device_type()
    if kind == api.CPU:
        return SKIP, "CPU host: attention runs SDPA's math kernel (fused kernels are on cards)"
    d = api.get_device(0)
    q = torch.randn(1, 128, 2, 64, device=d, dtype=torch.bfloat16)  # batch, sequence, heads, head dim
    if kind == api.NPU:
        import torch_npu
        from diffusers.models.attention_dispatch import AttentionBackendName

        out = torch_npu.npu_fusion_attention(q, q, q, 2, "BSND", scale=64**-0.5, keep_prob=1.0)[0]
        if not bool(torch.isfinite(out).all().item()):
            raise CheckFailed("npu_fusion_attention returned non-finite values")
        if "_native_npu" not in {b.value for b in AttentionBackendName}:
            return WARN, "npu_fusion_attention runs, but this diffusers has no _native_npu backend (SDPA is used)"
        return PASS, f"torch_npu.npu_fusion_attention runs (diffusers backend {api.attention_backend_name()})"
    from torch.nn.attention import SDPBackend, sdpa_kernel

    qt = q.transpose(1, 2)
    try:
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]):
            torch.nn.functional.scaled_dot_product_attention(qt, qt, qt)
    except RuntimeError as e:
        return WARN, f"no fused SDPA kernel runs here ({first_line(e)}): the math kernel is slower and larger"
    return PASS, "SDPA's flash / memory-efficient kernels run"


def all_reduce(processes: int, backend: str, timeout_s: float, world_size: int | None = None) -> float:
    """Start ``processes`` ranks (rank i on card i), all-reduce ``rank + 1`` among ``world_size``
    (default: ``processes``) and check the sum; returns the seconds it took. A rank that fails, a
    wrong sum, or ranks still waiting after ``timeout_s`` (e.g. a rank that never joins) raise
    ``CheckFailed`` naming the rank and its error."""
    world = world_size or processes
    ctx = multiprocessing.get_context("spawn")  # fresh interpreters: no state of this one leaks in
    results = ctx.Queue()
    port = _free_port()
    t0 = time.monotonic()
    procs = [ctx.Process(target=_all_reduce_rank, args=(rank, world, port, backend, timeout_s, results), daemon=True)
             for rank in range(processes)]
    for p in procs:
        p.start()
    reports: dict[int, str | None] = {}
    deadline = t0 + timeout_s + 120  # + starting the interpreters and importing torch (and torch_npu)
    try:
        while len(reports) < processes and time.monotonic() < deadline:
            try:
                rank, error = results.get(timeout=0.5)
                reports[rank] = error
            except Exception:  # queue.Empty: are the silent ranks still alive?
                if not any(p.is_alive() for p in procs) and results.empty():
                    break
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join()
    errors = {r: e for r, e in sorted(reports.items()) if e}
    if errors:
        rank, error = next(iter(errors.items()))
        more = f" (and {len(errors) - 1} more rank(s))" if len(errors) > 1 else ""
        raise CheckFailed(f"rank {rank}: {error}{more}")
    silent = [r for r in range(processes) if r not in reports]
    if silent:
        codes = {r: procs[r].exitcode for r in silent}
        raise CheckFailed(f"rank(s) {silent} gave no answer within {timeout_s:.0f} s (exit codes {codes})")
    return time.monotonic() - t0


def _all_reduce_rank(rank: int, world: int, port: int, backend: str, timeout_s: float, results) -> None:
    error = None
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # a timeout is reported once, as this rank's error
    try:
        import datetime

        import torch
        import torch.distributed as dist

        from dit4dit_npu.device import api

        api.set_device(rank)
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=timeout_s))
        try:
            t = torch.full((4,), float(rank + 1), device=api.get_device(rank))
            dist.all_reduce(t)
            api.synchronize()
            want = world * (world + 1) / 2
            if not torch.equal(t.cpu(), torch.full((4,), want)):
                error = f"the sum is {t.cpu().tolist()}, expected {want}"
        finally:
            dist.destroy_process_group()
    except Exception as e:
        error = first_line(e)
    results.put((rank, error))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
