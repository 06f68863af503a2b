"""scripts/setup_env.sh on an Ascend-like image, in scratch virtualenvs (never this checkout's .venv).

The "image" is a real Python installation whose own site-packages already has torch, as a CANN
image's Python has torch + torch_npu: this interpreter's stdlib (linked) with a site-packages that
sees this environment's torch. ``--system-site-packages`` builds the virtualenv over it, and the
script must keep that torch (never install one from the registry) and check the stack before
building anything on it; with a torch_npu that cannot load CANN, it stops with the one-line fix.
The default path (no torch: install TORCH_SPEC) is what every fresh checkout and
scripts/compat_check.sh (Python 3.10) run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SETUP = ROOT / "scripts" / "setup_env.sh"
NO_CANN = ("libhccl.so: cannot open shared object file: No such file or directory. Please check that the cann "
           "package is installed. Please run 'source set_env.sh' in the CANN installation path.")


def setup(args: list[str], **env: str) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if k not in ("VENV", "PYTHON", "VIRTUAL_ENV")}
    return subprocess.run(["bash", str(SETUP), *args], capture_output=True, text=True, env={**e, **env}, timeout=900)


def image_python(root: Path, extra_sites: list[Path]) -> Path:
    """A Python installation at ``root`` (not a virtualenv): this interpreter's binary and stdlib,
    and a site-packages of its own that adds ``extra_sites`` (.pth), e.g. a folder with torch."""
    base = Path(sys.base_prefix)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    stdlib = base / "lib" / version
    (root / "bin").mkdir(parents=True)
    site = root / "lib" / version / "site-packages"
    site.mkdir(parents=True)
    for entry in stdlib.iterdir():
        if entry.name != "site-packages":
            (site.parent / entry.name).symlink_to(entry)
    exe = root / "bin" / version
    exe.write_bytes(Path(os.path.realpath(sys._base_executable)).read_bytes())
    exe.chmod(0o755)
    (site / "image.pth").write_text("".join(f"{p}\n" for p in extra_sites))
    r = subprocess.run([str(exe), "-c", "import sys; print(sys.prefix)"], capture_output=True, text=True)
    if r.returncode != 0 or Path(r.stdout.strip()) != root:
        pytest.skip(f"this interpreter cannot be laid out as a separate installation here: {r.stderr[-300:]}")
    return exe


def this_site_packages() -> Path:
    return Path(sysconfig.get_paths()["purelib"])


@pytest.mark.slow
def test_an_images_torch_is_kept_and_checked(tmp_path):
    py = image_python(tmp_path / "image", [this_site_packages()])
    venv = tmp_path / "venv"
    r = setup(["--system-site-packages", "--torch-only"], PYTHON=str(py), VENV=str(venv))
    assert r.returncode == 0, r.stdout + r.stderr
    torch_dir = Path(torch.__file__).parent
    assert (f"[setup] keeping the installed torch {torch.__version__.split('+')[0]} ({torch_dir}): never replaced "
            "from the registry") in r.stdout
    assert f"PASS torch: {torch.__version__} imports" in r.stdout
    assert r.stdout.index("[setup] upgrading pip") < r.stdout.index("[setup] keeping")  # pip first
    own = venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    assert not (own / "torch").exists()  # nothing installed over the image's torch
    assert "include-system-site-packages = true" in (venv / "pyvenv.cfg").read_text()

    # the same virtualenv asked for without system site packages: one line, nothing touched
    r = setup(["--torch-only"], PYTHON=str(py), VENV=str(venv))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "include-system-site-packages = true" in r.stderr


@pytest.mark.slow
def test_an_image_with_torch_npu_but_no_cann_stops_with_the_fix(tmp_path):
    fake = tmp_path / "ascend_site"
    (fake / "torch_npu").mkdir(parents=True)
    (fake / "torch_npu" / "__init__.py").write_text(f"raise ImportError({NO_CANN!r})\n")
    info = fake / "torch_npu-2.7.1.post4.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch_npu\nVersion: 2.7.1.post4\n")
    (info / "entry_points.txt").write_text("[torch.backends]\ntorch_npu = torch_npu:_autoload\n")
    py = image_python(tmp_path / "image", [this_site_packages(), fake])
    r = setup(["--system-site-packages"], PYTHON=str(py), VENV=str(tmp_path / "venv"))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "keeping the installed torch" in r.stdout and "and torch_npu 2.7.1.post4" in r.stdout
    fails = [line for line in r.stdout.splitlines() if line.startswith("FAIL ")]
    assert ("FAIL torch: import torch fails: torch_npu is installed but cannot load CANN's libhccl.so: install CANN "
            "and source its set_env.sh (e.g. source /usr/local/Ascend/ascend-toolkit/set_env.sh); on a host without "
            "Ascend cards: pip uninstall torch_npu") in fails
    assert r.stderr.strip().splitlines()[-1] == "[setup] stopped: fix the FAIL line(s) above, then run this script again"
    assert "installing" not in r.stdout  # nothing was built on the broken stack


def test_bad_arguments_are_one_line(tmp_path):
    for args, text in ((["--bogus"], "unknown argument --bogus"),
                       (["--no-venv", "--system-site-packages"], "exclude each other")):
        r = setup(args, VENV=str(tmp_path / "venv"))
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and text in r.stderr, r.stderr
    assert not (tmp_path / "venv").exists()
