"""The installed software stack, read without importing torch in this process: Python, torch,
torch_npu, CANN, whether ``import torch`` works, and whether the shared libraries a launch needs
resolve.

Standard library only, on purpose: ``scripts/setup_env.sh`` runs these checks (through
``python -m dit4dit_npu.doctor --stack``) before anything else is installed, and the doctor runs
them first, because the most common broken Ascend stack, torch_npu without CANN, breaks
``import torch`` itself. Whatever imports torch runs in a child process here.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

# The Ascend Extension for PyTorch (torch_npu) is built for exactly one PyTorch release: its
# version is that release's major.minor.patch plus an optional suffix (2.7.1, 2.7.1.post4,
# 2.7.1rc1, ...). Source: the "Ascend Extension for PyTorch Version Matching Table" in the README
# of Ascend/pytorch (gitcode.com/Ascend/pytorch): e.g. 2.7.1.post4 -> PyTorch 2.7.1 (CANN 9.0.0),
# 2.7.1.post2 -> 2.7.1 (CANN 8.5.0), 2.7.1 -> 2.7.1 (CANN 8.3.RC1).
_RELEASE = re.compile(r"^\s*(\d+)\.(\d+)\.(\d+)")

# What CANN's absence looks like when torch_npu is installed. torch >= 2.5 loads installed device
# backends while `import torch` runs (entry points, group "torch.backends"), so the failure
# surfaces there as "RuntimeError: Failed to load the backend extension: torch_npu. You can
# disable extension auto-loading with TORCH_DEVICE_BACKEND_AUTOLOAD=0.", raised from torch_npu's
# "ImportError: libhccl.so: cannot open shared object file: No such file or directory. Please
# check that the cann package is installed. Please run 'source set_env.sh' in the CANN
# installation path." (older releases name libascendcl.so, or another CANN library).
_CANN_LIBRARY = re.compile(r"\b(lib(?:hccl|ascendcl|ascend_hal|acl_op_compiler|ge_runner|graph|opapi|runtime)\S*?\.so)\b")
_BACKEND_LOAD = "Failed to load the backend extension: torch_npu"

# Where CANN's installer puts the toolkit (root install; non-root installs go under $HOME), and
# the variables its set_env.sh exports.
CANN_HOME_VARIABLES = ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME")
CANN_DEFAULT_HOMES = ("/usr/local/Ascend/ascend-toolkit/latest", "/usr/local/Ascend/cann")


def python_version() -> str:
    return platform.python_version()


def installed_version(distribution: str) -> str | None:
    """The installed version of a distribution (package metadata only: nothing is imported)."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def release(version: str) -> tuple[int, int, int] | None:
    """major.minor.patch of a version string (local and pre/post suffixes ignored)."""
    m = _RELEASE.match(version)
    return (int(m[1]), int(m[2]), int(m[3])) if m else None


def pair_problem(torch_version: str, torch_npu_version: str) -> str | None:
    """Why this torch and this torch_npu do not belong together, or None when they do."""
    a, b = release(torch_version), release(torch_npu_version)
    if a is None or b is None:
        return f"cannot read the versions torch {torch_version!r} / torch_npu {torch_npu_version!r}"
    if a != b:
        want = ".".join(map(str, b))
        return (f"torch_npu {torch_npu_version} is built for torch {want}, but torch is {torch_version}: "
                f"install torch=={want} (or the torch_npu release of your torch; Ascend/pytorch's version table)")
    return None


@dataclasses.dataclass(frozen=True)
class Cann:
    version: str
    home: Path


def cann_toolkit(environ: dict[str, str] | None = None) -> Cann | None:
    """The CANN toolkit this host has: its version from ``<home>/<arch>-linux/ascend_toolkit_install.info``
    (``version=9.0.0``), where home is what CANN's set_env.sh exported, else a default location."""
    env = os.environ if environ is None else environ
    homes = [env[v] for v in CANN_HOME_VARIABLES if env.get(v)] + list(CANN_DEFAULT_HOMES)
    for home in homes:
        info = Path(home) / f"{platform.machine()}-linux" / "ascend_toolkit_install.info"
        try:
            text = info.read_text(errors="replace")
        except OSError:
            continue
        m = re.search(r"^\s*version\s*=\s*(\S+)", text, re.MULTILINE)
        if m:
            return Cann(m[1], Path(home))
    return None


def cann_fix(cann: Cann | None) -> str:
    """The one-line fix for torch_npu that cannot load CANN."""
    if cann is not None:
        return f"source {cann.home}/set_env.sh (CANN {cann.version} is installed there) before running Python"
    return ("install CANN and source its set_env.sh (e.g. source /usr/local/Ascend/ascend-toolkit/set_env.sh); "
            "on a host without Ascend cards: pip uninstall torch_npu")


# --------------------------------------------------------------------------------------------
# import torch, in a child process
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TorchImport:
    ok: bool
    version: str | None = None  # torch.__version__ when it imported
    error: str = ""  # the last lines of the child's stderr otherwise


_IMPORT_TORCH = "import json, torch; print(json.dumps({'version': torch.__version__}))"


def import_torch(python: str = sys.executable, environ: dict[str, str] | None = None,
                 timeout_s: float = 300.0) -> TorchImport:
    """Import torch in a fresh interpreter: a broken stack fails there (an exception, or an old
    torch_npu's ``sys.exit`` or a crash), never in the caller."""
    try:
        r = subprocess.run([python, "-c", _IMPORT_TORCH], capture_output=True, text=True, timeout=timeout_s,
                           env=dict(os.environ if environ is None else environ))
    except subprocess.TimeoutExpired:
        return TorchImport(False, error=f"import torch did not finish within {timeout_s:.0f} s")
    if r.returncode == 0:
        try:
            return TorchImport(True, json.loads(r.stdout.strip().splitlines()[-1])["version"])
        except (ValueError, IndexError, KeyError):
            pass
    return TorchImport(False, error="\n".join((r.stderr or r.stdout).strip().splitlines()[-12:]))


def explain_import_error(error: str, cann: Cann | None) -> str:
    """One line for a failed ``import torch``: the known cause and its fix, else the error's last line."""
    library = _CANN_LIBRARY.search(error)
    if _BACKEND_LOAD in error or (library and "torch_npu" in error):
        missing = f"CANN's {library[1]}" if library else "CANN"
        return f"import torch fails: torch_npu is installed but cannot load {missing}: {cann_fix(cann)}"
    lines = [line.strip() for line in error.splitlines() if line.strip()]
    return f"import torch fails: {lines[-1] if lines else 'no error text'}"


# --------------------------------------------------------------------------------------------
# Shared libraries
# --------------------------------------------------------------------------------------------


def library_paths() -> list[str]:
    """torch's (and torch_npu's, when installed) lib folders: compiled extensions imported before
    torch otherwise fail with "libc10.so: cannot open shared object file". Never imports them."""
    paths = []
    for name in ("torch", "torch_npu"):
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin:
            paths.append(os.path.join(os.path.dirname(spec.origin), "lib"))
    return paths


def launch_library_path(environ: dict[str, str] | None = None) -> str:
    """The LD_LIBRARY_PATH a launcher exports (``launch.launch_env``): the lib folders first, then
    what the environment already has."""
    env = os.environ if environ is None else environ
    return ":".join([*library_paths(), *([env["LD_LIBRARY_PATH"]] if env.get("LD_LIBRARY_PATH") else [])])

_DLOPEN = """
import ctypes, json, sys
out = {}
for name in sys.argv[1:]:
    try:
        ctypes.CDLL(name)
        out[name] = None
    except OSError as e:
        out[name] = str(e)
print(json.dumps(out))
"""


def load_libraries(names: list[str], ld_library_path: str | None, python: str = sys.executable) -> dict[str, str | None]:
    """dlopen each library by name, as an extension's loader would, in a fresh process whose
    LD_LIBRARY_PATH is ``ld_library_path`` (the dynamic loader reads it only at start-up):
    name -> None when it loads, else the loader's error (which names what is missing)."""
    env = dict(os.environ)
    env.pop("LD_LIBRARY_PATH", None)
    if ld_library_path:
        env["LD_LIBRARY_PATH"] = ld_library_path
    r = subprocess.run([python, "-c", _DLOPEN, *names], capture_output=True, text=True, env=env, timeout=120)
    try:
        return json.loads(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        error = (r.stderr or "no output").strip().splitlines()[-1:] or ["no output"]
        return dict.fromkeys(names, error[0])
