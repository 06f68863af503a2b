"""Pre-flight checks of this host's stack and cards, one ``Result`` line each (PASS / WARN / FAIL /
SKIP). ``python -m dit4dit_npu.doctor`` (``dit4dit_npu/doctor.py``) runs them, and adds the checks
that need the run config (data, base model, run folder, memory plan).

Two halves:
- the stack (``stack_checks``): Python, torch, torch_npu and CANN and whether they belong
  together, the packages, the shared libraries. No torch in this process: torch_npu without
  CANN breaks ``import torch`` itself, so that is what a child process finds out and explains;
- the host (``host_checks``): visible cards vs the processes a launch will start, a tiny
  training step on each card, fused attention, a real all-reduce over the launch's backend, free
  card memory against a planned number of bytes. These go through the device layer's answers.

Every probe is a small function of this module (or of ``stack``/``api``), so tests drive the
real checks on a simulated host by substituting probe results, as ``tests/test_device.py``
simulates NPU/CUDA hosts. Importing this module imports no torch.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import socket
import time
from collections.abc import Iterator

from dit4dit_npu.device import stack

PASS, WARN, FAIL, SKIP = "PASS", "WARN", "FAIL", "SKIP"
# The plan (bench/memory.py) leaves out the runtime's own reserve and allocator fragmentation.
MEMORY_HEADROOM_BYTES = 4 * 2**30
LAUNCH_PATH_HINT = "scripts/train_8p.sh exports it; other launchers: eval \"$(python -m dit4dit_npu.device env)\""


@dataclasses.dataclass(frozen=True)
class Result:
    status: str
    name: str
    detail: str

    def line(self) -> str:
        return f"{self.status} {self.name}: {' '.join(self.detail.split())}"


class CheckFailed(Exception):
    """A probe's one-line reason for a FAIL."""


def _first_line(e: BaseException) -> str:
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return lines[0] if lines else type(e).__name__


# --------------------------------------------------------------------------------------------
# The stack (no torch in this process)
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Stack:
    """What the stack checks found; the host checks run only when torch imports."""

    torch: stack.TorchImport | None = None
    torch_npu: str | None = None  # its installed version


def stack_checks(found: Stack, package_requirements: bool = True) -> Iterator[Result]:
    yield check_python()
    found.torch_npu = stack.installed_version("torch_npu")
    cann = stack.cann_toolkit()
    found.torch = stack.import_torch()
    yield check_torch(found.torch, cann)
    yield check_torch_npu(found.torch_npu, found.torch)
    yield check_cann(cann, found.torch_npu)
    if package_requirements:
        yield check_packages()
    if found.torch.ok:
        yield check_libraries(found.torch_npu is not None)
    else:
        yield Result(SKIP, "libraries", "torch does not import (see above)")


def check_python() -> Result:
    version = stack.python_version()
    wanted = _requires_python()
    if wanted is None:
        return Result(PASS, "python", f"{version} (dit4dit-npu is not installed yet: pip checks requires-python)")
    try:
        from packaging.specifiers import SpecifierSet

        ok = version in SpecifierSet(wanted)
    except ImportError:
        return Result(PASS, "python", f"{version} (dit4dit-npu requires {wanted})")
    if not ok:
        return Result(FAIL, "python", f"{version}, but dit4dit-npu requires {wanted}")
    return Result(PASS, "python", f"{version} (dit4dit-npu requires {wanted})")


def _requires_python() -> str | None:
    import importlib.metadata

    try:
        return importlib.metadata.metadata("dit4dit-npu")["Requires-Python"]
    except (importlib.metadata.PackageNotFoundError, KeyError):
        return None


def check_torch(found: stack.TorchImport, cann: stack.Cann | None) -> Result:
    if not found.ok:
        return Result(FAIL, "torch", stack.explain_import_error(found.error, cann))
    return Result(PASS, "torch", f"{found.version} imports")


def check_torch_npu(version: str | None, torch: stack.TorchImport) -> Result:
    if version is None:
        return Result(SKIP, "torch_npu", "not installed (no Ascend NPU stack here)")
    torch_version = torch.version or stack.installed_version("torch")
    if torch_version is None:
        want = ".".join(map(str, stack.release(version) or ()))
        return Result(FAIL, "torch_npu", f"{version} is installed without torch: install torch=={want}")
    problem = stack.pair_problem(torch_version, version)
    if problem:
        return Result(FAIL, "torch_npu", problem)
    return Result(PASS, "torch_npu", f"{version} matches torch {torch_version}")


def check_cann(cann: stack.Cann | None, torch_npu: str | None) -> Result:
    if cann is not None:
        return Result(PASS, "CANN", f"{cann.version} ({cann.home})")
    where = ", ".join([f"${v}" for v in stack.CANN_HOME_VARIABLES] + list(stack.CANN_DEFAULT_HOMES))
    if torch_npu is None:
        return Result(SKIP, "CANN", f"no toolkit found ({where}); needed only with torch_npu")
    return Result(FAIL, "CANN", f"torch_npu {torch_npu} is installed but no CANN toolkit was found ({where}): "
                                f"{stack.cann_fix(None)}")


def check_packages() -> Result:
    """Every requirement of dit4dit-npu (extras aside) is installed at a version it accepts."""
    import importlib.metadata

    try:
        from packaging.requirements import Requirement
    except ImportError:
        return Result(SKIP, "packages", "the packaging module is missing (pip install packaging)")
    try:
        requires = importlib.metadata.requires("dit4dit-npu") or []
    except importlib.metadata.PackageNotFoundError:
        return Result(FAIL, "packages", "dit4dit-npu is not installed here: bash scripts/setup_env.sh (or pip install -e .)")
    problems, count = [], 0
    for text in requires:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue  # an extra's requirement
        count += 1
        have = stack.installed_version(req.name)
        if have is None:
            problems.append(f"{req.name} is missing")
        elif not req.specifier.contains(have, prereleases=True):
            problems.append(f"{req.name} {have} (needs {req.specifier})")
    if problems:
        return Result(FAIL, "packages", f"{'; '.join(problems)}: bash scripts/setup_env.sh (or pip install -e .)")
    return Result(PASS, "packages", f"the {count} requirements of dit4dit-npu are met")


def check_libraries(with_torch_npu: bool) -> Result:
    """libc10.so (and libtorch_npu.so with torch_npu) resolve by name, as an extension imported
    before torch needs them (seed: mx_driving's "libc10.so: cannot open shared object file"):
    with the library path a launch exports, and, on Ascend hosts, in this shell too."""
    names = ["libc10.so"] + (["libtorch_npu.so"] if with_torch_npu else [])
    launch_path = stack.launch_library_path()
    launched = stack.load_libraries(names, launch_path)
    broken = {n: e for n, e in launched.items() if e}
    if broken:
        why = "; ".join(f"{n}: {_loader_reason(e)}" for n, e in broken.items())
        fix = stack.cann_fix(stack.cann_toolkit()) if "libtorch_npu.so" in broken else "reinstall torch"
        return Result(FAIL, "libraries", f"{why} (library path {launch_path or 'empty'}): {fix}")
    here = stack.load_libraries(names, os.environ.get("LD_LIBRARY_PATH"))
    shell_missing = [n for n, e in here.items() if e]
    listed = ", ".join(names)
    if shell_missing and with_torch_npu:
        return Result(WARN, "libraries", f"{', '.join(shell_missing)} load only with the launch library path "
                                         f"({LAUNCH_PATH_HINT}); extensions imported before torch fail without it")
    note = "" if not shell_missing else f" ({LAUNCH_PATH_HINT})"
    return Result(PASS, "libraries", f"{listed}: load with the launch library path{note}")


def _loader_reason(error: str) -> str:
    # ctypes' message repeats the path it was given; the loader's reason is what follows it
    return error.split(": ", 1)[-1] if ": " in error else error


# --------------------------------------------------------------------------------------------
# The host (torch imported, through the device layer)
# --------------------------------------------------------------------------------------------


def host_checks(num_processes: int | None, timeout_s: float) -> Iterator[Result]:
    from dit4dit_npu.device import api

    kind = api.device_type()
    n = num_processes or (2 if kind == api.CPU else api.device_count())
    yield check_cards(n)
    yield _guarded("attention", fused_attention)
    yield check_step(n)
    yield check_collective(n, timeout_s)


def _guarded(name: str, probe) -> Result:
    try:
        status, detail = probe()
    except Exception as e:  # a probe that crashed is that check's FAIL, never the doctor's
        return Result(FAIL, name, _first_line(e))
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
            tiny_step(i)
        except Exception as e:
            where = api.CPU if kind == api.CPU else f"{kind}:{i}"
            return Result(FAIL, "step", f"{where}: {_first_line(e)}")
    optimizer = "fused AdamW" if api.supports_fused_adamw() else "AdamW (foreach; fused on cards only)"
    cards = "cpu" if kind == api.CPU else f"{len(indices)} {kind} card(s)"
    return Result(PASS, "step", f"{cards}: forward + backward + {optimizer} under bf16 autocast, finite and updated")


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
    """Whether the fused attention kernel the model uses on this device runs."""
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
        return WARN, f"no fused SDPA kernel runs here ({_first_line(e)}): the math kernel is slower and larger"
    return PASS, "SDPA's flash / memory-efficient kernels run"


# --------------------------------------------------------------------------------------------
# The collective: a real all-reduce over the launch's backend, one process per card
# --------------------------------------------------------------------------------------------


def check_collective(n: int, timeout_s: float) -> Result:
    from dit4dit_npu.device import api

    backend = api.dist_backend()
    where = f"{n} CPU process(es)" if api.device_type() == api.CPU else f"{n} {api.device_type()} card(s)"
    try:
        seconds = all_reduce(n, backend, timeout_s)
    except CheckFailed as e:
        return Result(FAIL, "collective", f"all-reduce over {backend} across {where}: {e}")
    return Result(PASS, "collective", f"all-reduce over {backend} across {where} ({seconds:.1f} s; this node only)")


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
        error = _first_line(e)
    results.put((rank, error))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------------------------
# Card memory against a plan
# --------------------------------------------------------------------------------------------


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
