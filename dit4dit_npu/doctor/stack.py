"""The doctor's stack checks: Python, torch, torch_npu and CANN and whether they belong together,
the packages, the shared libraries. No torch in this process: torch_npu without CANN breaks
``import torch`` itself, so that is what a child process finds out and explains (the probes are
the device layer's ``device/stack.py``). ``scripts/setup_env.sh`` runs these alone
(``python -m dit4dit_npu.doctor --stack``) from the source tree before anything is installed.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator

from dit4dit_npu.device import stack
from dit4dit_npu.doctor.results import FAIL, PASS, SKIP, WARN, Result

LAUNCH_PATH_HINT = "scripts/train_8p.sh exports it; other launchers: eval \"$(python -m dit4dit_npu.device env)\""


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
