"""The package faces that import on first use (a module ``__getattr__``) keep them only for a
reason, tested here or where named:

- ``dit4dit_npu``: ``import dit4dit_npu`` (what a robot-side process or a config tool pays) loads no
  torch, and ``dit4dit_npu.DiT4DiTPolicy`` still resolves;
- ``dit4dit_npu.data``: ``python -m dit4dit_npu.data.demo`` / ``.inspect`` run without runpy's
  "found in sys.modules after import of package" RuntimeWarning, which an eager face gives;
- ``dit4dit_npu.device``: the doctor's stack check runs where ``import torch`` fails
  (tests/test_doctor.py::test_torch_npu_without_cann_is_found_with_the_one_line_fix, a real
  broken torch); here: importing the package and its stack probe loads no torch.

``dit4dit_npu.models`` has no such face: its names are plain imports.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "DS_ACCELERATOR": "cpu"}


def _python(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT, env=ENV, timeout=120)


def test_import_dit4dit_npu_and_its_light_layers_load_no_torch():
    code = ("import sys, dit4dit_npu, dit4dit_npu.config, dit4dit_npu.device, dit4dit_npu.device.stack\n"
            "print(sorted(m for m in ('torch', 'diffusers', 'transformers') if m in sys.modules))")
    r = _python("-c", code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_the_top_level_face_resolves_the_policy_class():
    import dit4dit_npu
    from dit4dit_npu.policy import DiT4DiTPolicy

    assert dit4dit_npu.DiT4DiTPolicy is DiT4DiTPolicy
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        dit4dit_npu.Nope  # noqa: B018


@pytest.mark.parametrize("module", ["dit4dit_npu.data.demo", "dit4dit_npu.data.inspect"])
def test_data_commands_run_as_modules_without_runpy_warnings(module):
    r = _python("-W", "error::RuntimeWarning", "-m", module, "--help")
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith("usage:") and "RuntimeWarning" not in r.stderr
