"""``python -m dit4dit_npu.doctor``: for real on this host (CPU: PASS and SKIP, exit 0), on a real
broken stack (a torch_npu without CANN on the path, which breaks the real ``import torch``), with a
real all-reduce that cannot complete, and on a simulated Ascend host: healthy (every line PASS),
then broken one way at a time, each giving exactly one FAIL line and exit code 1.

The simulation substitutes the probes' results (``device.api``'s device probes, ``stack``'s
version/CANN/library probes, and the doctor's per-card probes), as tests/test_device.py simulates
NPU/CUDA hosts; what can run here runs for real (import torch, dlopen, gloo all-reduce, the step
on the CPU, the config/data/folder checks).
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dit4dit_npu import device
from dit4dit_npu.device import probes, stack
from dit4dit_npu.doctor import cli as cmd
from dit4dit_npu.doctor import host as checks
from dit4dit_npu.doctor import run_config

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs/robotwin/dit4dit_robotwin_tiny.yaml"
TORCH = torch.__version__
GIB = 2**30
REAL_LOAD_LIBRARIES = stack.load_libraries  # the simulated host substitutes it; one test needs the real one
ORDER = ["python", "torch", "torch_npu", "CANN", "packages", "libraries", "cards", "attention", "step", "collective",
         "base model", "model", "compile", "data", "run folder", "memory"]
# what CANN-less hosts print (torch_npu's own ImportError text, under torch's backend autoload)
NO_CANN = ("libhccl.so: cannot open shared object file: No such file or directory. Please check that the cann "
           "package is installed. Please run 'source set_env.sh' in the CANN installation path.")


def parse(out: str) -> dict[str, tuple[str, str]]:
    lines = [line for line in out.splitlines() if re.match(r"^(PASS|WARN|FAIL|SKIP) ", line)]
    parsed = {}
    for line in lines:
        status, rest = line.split(" ", 1)
        name, detail = rest.split(": ", 1)
        parsed[name] = (status, detail)
    return parsed


def doctor_subprocess(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    e = {**os.environ, **env}
    return subprocess.run([sys.executable, "-m", "dit4dit_npu.doctor", *args], capture_output=True, text=True,
                          cwd=cwd, env=e, timeout=600)


def fake_torch_npu(root: Path, version: str, autoload: bool = True) -> Path:
    """A torch_npu distribution whose import fails as it does without CANN; with ``autoload`` it
    registers torch's backend entry point as the real one does, so the real ``import torch`` fails."""
    (root / "torch_npu" / "lib").mkdir(parents=True)
    (root / "torch_npu" / "__init__.py").write_text(f"raise ImportError({NO_CANN!r})\n")
    info = root / f"torch_npu-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch_npu\nVersion: {version}\n")
    if autoload:
        (info / "entry_points.txt").write_text("[torch.backends]\ntorch_npu = torch_npu:_autoload\n")
    return root


def fake_cann(root: Path, version: str = "9.0.0") -> Path:
    import platform

    info = root / f"{platform.machine()}-linux" / "ascend_toolkit_install.info"
    info.parent.mkdir(parents=True)
    info.write_text(f"package_name=Ascend-cann-toolkit\nversion={version}\ninnerversion=V100R001\n")
    return root


# --------------------------------------------------------------------------------------------
# For real
# --------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_doctor_on_this_host_passes_and_skips_and_writes_nothing(tmp_path):
    before = sorted(tmp_path.rglob("*"))
    r = doctor_subprocess(["--config", str(TINY), f"run_root_dir={tmp_path / 'runs'}"], cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    found = parse(r.stdout)
    assert list(found) == ORDER, r.stdout
    assert {s for s, _ in found.values()} <= {"PASS", "SKIP"}, r.stdout
    assert found["torch"] == ("PASS", f"{TORCH} imports")
    assert found["step"][0] == "PASS" and found["collective"][0] == "PASS"
    assert "all-reduce over gloo across 2 CPU process(es)" in found["collective"][1]
    assert found["data"] == ("PASS", "demo_data/robotwin_demo is generated on first use")
    assert sorted(tmp_path.rglob("*")) == before  # the run folder probe left nothing behind


@pytest.mark.slow  # over 4 s of one core: the full tier (the fast tier keeps to 3 minutes)
def test_torch_npu_without_cann_is_found_with_the_one_line_fix(tmp_path):
    """The real failure: torch's backend autoload imports the installed torch_npu, which cannot load CANN."""
    fake = fake_torch_npu(tmp_path / "site", f"{TORCH.split('+')[0]}.post4")
    env = {"PYTHONPATH": str(fake)}
    r = subprocess.run([sys.executable, "-c", "import torch"], capture_output=True, text=True, env={**os.environ, **env})
    assert "Failed to load the backend extension: torch_npu" in r.stderr  # the real torch failing

    r = doctor_subprocess(["--stack"], cwd=tmp_path, **env)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stdout + r.stderr
    found = parse(r.stdout)
    assert found["torch"] == ("FAIL", "import torch fails: torch_npu is installed but cannot load CANN's libhccl.so: "
                                      "install CANN and source its set_env.sh (e.g. source "
                                      "/usr/local/Ascend/ascend-toolkit/set_env.sh); on a host without Ascend cards: "
                                      "pip uninstall torch_npu")
    assert found["CANN"][0] == "FAIL" and found["libraries"][0] == "SKIP"

    # CANN installed but its set_env.sh not sourced: the fix names it
    cann = fake_cann(tmp_path / "Ascend" / "ascend-toolkit" / "latest")
    r = doctor_subprocess([], cwd=tmp_path, ASCEND_TOOLKIT_HOME=str(cann), **env)
    assert r.returncode == 1, r.stdout + r.stderr
    found = parse(r.stdout)
    assert found["torch"] == ("FAIL", "import torch fails: torch_npu is installed but cannot load CANN's libhccl.so: "
                                      f"source {cann}/set_env.sh (CANN 9.0.0 is installed there) before running Python")
    assert found["CANN"] == ("PASS", f"9.0.0 ({cann})")
    assert [n for n, (s, _) in found.items() if s == "FAIL"] == ["torch"]
    assert all(found[n] == ("SKIP", "torch does not import (see above)") for n in ("cards", "step", "collective"))


@pytest.mark.slow  # over 4 s of one core: the full tier (the fast tier keeps to 3 minutes)
def test_all_reduce_for_real_over_gloo():
    assert probes.all_reduce(2, "gloo", timeout_s=60) > 0


@pytest.mark.slow
def test_a_collective_that_cannot_complete_is_one_fail_line(monkeypatch, capsys):
    """A real all-reduce whose third rank never joins (world size 3, 2 processes): the ranks time out."""
    monkeypatch.setattr(probes, "all_reduce", functools.partial(probes.all_reduce, world_size=3))
    assert cmd.main(["--timeout", "5"]) == 1
    found = parse(capsys.readouterr().out)
    assert [n for n, (s, _) in found.items() if s == "FAIL"] == ["collective"]
    status, detail = found["collective"]
    assert detail.startswith("all-reduce over gloo across 2 CPU process(es): rank 0: ") and "3" in detail, detail


# --------------------------------------------------------------------------------------------
# A simulated Ascend host: 8 cards, a matching torch_npu, CANN 9.0.0
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def real_torch_import():
    return stack.import_torch()  # once: the real child-process import of this environment's torch


class Ascend:
    """The probes' results on a healthy Ascend node; tests break one."""

    def __init__(self, monkeypatch, real_torch_import, tmp_path):
        self.mp, self.tmp = monkeypatch, tmp_path
        self.versions = {"torch_npu": f"{TORCH.split('+')[0]}.post4"}
        self.free = {i: 60 * GIB for i in range(8)}
        monkeypatch.delenv("DIT4DIT_DEVICE", raising=False)
        monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "0,1,2,3,4,5,6,7")
        monkeypatch.setattr(device.api, "_npu_available", lambda: True)
        monkeypatch.setattr(device.api, "_cuda_available", lambda: False)
        monkeypatch.setattr(device.api, "device_count", lambda: 8)
        monkeypatch.setattr(device.api, "memory_info", lambda i: (self.free[i], 64 * GIB))
        device.reset_cache()
        real_version = stack.installed_version
        monkeypatch.setattr(stack, "installed_version", lambda d: self.versions.get(d) or real_version(d))
        monkeypatch.setattr(stack, "import_torch", lambda *a, **k: real_torch_import)
        monkeypatch.setattr(stack, "cann_toolkit", lambda *a: stack.Cann("9.0.0", Path("/usr/local/Ascend/ascend-toolkit/latest")))
        monkeypatch.setattr(stack, "load_libraries", lambda names, path, *a: dict.fromkeys(names))
        monkeypatch.setattr(probes, "tiny_step", lambda i: None)
        monkeypatch.setattr(probes, "fused_attention", lambda: ("PASS", "torch_npu.npu_fusion_attention runs"))
        monkeypatch.setattr(probes, "all_reduce", lambda n, backend, timeout_s: 1.5)
        monkeypatch.setattr(run_config, "memory_plan", lambda cfg, world: (24.9e9, "plan (ZeRO-2, 8 ranks)"))

    def run(self, *args: str, capsys) -> tuple[int, dict]:
        argv = ["--config", str(TINY), f"run_root_dir={self.tmp / 'runs'}", *args]
        rc = cmd.main(argv)
        out = capsys.readouterr().out
        return rc, parse(out)


@pytest.fixture
def ascend(monkeypatch, real_torch_import, tmp_path):
    monkeypatch.chdir(tmp_path)
    host = Ascend(monkeypatch, real_torch_import, tmp_path)
    yield host
    device.reset_cache()


def fails(found: dict) -> list[str]:
    return [n for n, (s, _) in found.items() if s == "FAIL"]


def test_a_healthy_ascend_node_passes_every_check(ascend, capsys):
    rc, found = ascend.run(capsys=capsys)
    assert rc == 0 and list(found) == ORDER
    assert {n: s for n, (s, _) in found.items() if s != "PASS"} == {}
    assert found["torch_npu"][1] == f"{ascend.versions['torch_npu']} matches torch {TORCH}"
    assert found["cards"][1] == ("8 visible npu card(s) (ASCEND_RT_VISIBLE_DEVICES=0,1,2,3,4,5,6,7) for 8 "
                                 "process(es) per node")
    assert found["step"][1] == "8 npu card(s): forward + backward + fused AdamW under bf16 autocast, finite and updated"
    assert found["collective"][1] == "all-reduce over hccl across 8 npu card(s) (1.5 s; this node only)"
    assert found["memory"][1] == "plan (ZeRO-2, 8 ranks): 23.2 GiB per card; npu:0 has 60.0 of 64.0 GiB free"


def test_a_run_config_that_compiles_on_ascend_is_one_fail_naming_the_key(ascend, capsys):
    """trainer.compile is refused on NPU (not verified there yet): the doctor says so before the run
    is launched, where the run itself would stop at its first step."""
    rc, found = ascend.run(capsys=capsys)
    assert found["compile"] == ("PASS", "trainer.compile is off: the backbone's blocks run eager")
    rc, found = ascend.run("trainer.compile=true", capsys=capsys)
    assert rc == 1 and fails(found) == ["compile"]
    assert found["compile"][1].startswith("trainer.compile: torch.compile is not verified on Ascend NPU yet")
    assert found["compile"][1].endswith("; set it off")


def test_a_torch_npu_of_another_torch_is_one_fail(ascend, capsys):
    major, minor = (int(x) for x in TORCH.split("+")[0].split(".")[:2])
    other = f"{major}.{minor + 1}.0"  # the next minor release: another torch than this one, on any stack
    ascend.versions["torch_npu"] = f"{other}.post4"
    rc, found = ascend.run(capsys=capsys)
    assert rc == 1 and fails(found) == ["torch_npu"]
    assert found["torch_npu"][1] == (f"torch_npu {other}.post4 is built for torch {other}, but torch is {TORCH}: install "
                                     f"torch=={other} (or the torch_npu release of your torch; Ascend/pytorch's version table)")


def test_a_missing_library_is_one_fail(ascend, capsys, monkeypatch, tmp_path):
    """The real dlopen: torch's libc10.so loads, a torch_npu lib folder without libtorch_npu.so does not."""
    monkeypatch.setattr(stack, "load_libraries", REAL_LOAD_LIBRARIES)
    empty = tmp_path / "torch_npu" / "lib"
    empty.mkdir(parents=True)
    monkeypatch.setattr(stack, "library_paths", lambda: [str(Path(torch.__file__).parent / "lib"), str(empty)])
    rc, found = ascend.run(capsys=capsys)
    assert rc == 1 and fails(found) == ["libraries"]
    assert found["libraries"][1].startswith("libtorch_npu.so: cannot open shared object file: No such file or directory "
                                            "(library path ")
    assert found["libraries"][1].endswith("source /usr/local/Ascend/ascend-toolkit/latest/set_env.sh (CANN 9.0.0 is "
                                          "installed there) before running Python")


def test_fewer_cards_than_processes_is_one_fail(ascend, capsys):
    rc, found = ascend.run("--num-processes", "16", capsys=capsys)
    assert rc == 1 and fails(found) == ["cards"]
    assert found["cards"][1] == ("16 processes per node but only 8 visible npu card(s): use --num_processes <= 8 "
                                 "(one rank per physical card; check ASCEND_RT_VISIBLE_DEVICES)")


def test_a_failing_collective_is_one_fail(ascend, capsys, monkeypatch):
    def hccl_timeout(n, backend, timeout_s):
        raise probes.CheckFailed("rank 5: HCCL connect timed out")  # what all_reduce raises (tested for real above)

    monkeypatch.setattr(probes, "all_reduce", hccl_timeout)
    rc, found = ascend.run(capsys=capsys)
    assert rc == 1 and fails(found) == ["collective"]
    assert found["collective"][1] == "all-reduce over hccl across 8 npu card(s): rank 5: HCCL connect timed out"


@pytest.mark.parametrize("case", ["step", "attention", "memory", "cann", "packages", "python", "data", "base model",
                                  "config", "model", "run folder"])
def test_every_other_failure_is_one_fail_line(ascend, capsys, monkeypatch, tmp_path, case):
    args: list[str] = []
    expect = case
    if case == "step":
        def broken(i):
            if i == 3:
                raise RuntimeError("EZ9999: Inner Error!\nmore detail")
        monkeypatch.setattr(probes, "tiny_step", broken)
        text = "npu:3: EZ9999: Inner Error!"
    elif case == "attention":
        monkeypatch.setattr(probes, "fused_attention", lambda: (_ for _ in ()).throw(AttributeError(
            "module 'torch_npu' has no attribute 'npu_fusion_attention'")))
        text = "module 'torch_npu' has no attribute 'npu_fusion_attention'"
    elif case == "memory":
        ascend.free[6] = 20 * GIB
        text = "npu:6 has 20.0 of 64.0 GiB free: does not fit"
    elif case == "cann":
        monkeypatch.setattr(stack, "cann_toolkit", lambda *a: None)
        expect, text = "CANN", "is installed but no CANN toolkit was found"
    elif case == "packages":
        ascend.versions["diffusers"] = "0.35.1"
        text = "diffusers 0.35.1 (needs >=0.37)"
    elif case == "python":
        monkeypatch.setattr(stack, "python_version", lambda: "3.9.18")
        text = "3.9.18, but dit4dit-npu requires >=3.10"
    elif case == "data":
        args = [f"datasets.vla_data.data_root_dir={tmp_path / 'nowhere'}"]
        text = "dataset folder not found"
    elif case == "base model":
        args = [f"framework.cosmos25.base_model={tmp_path / 'no_model'}"]
        text = "is neither 'tiny' nor a folder"
    elif case == "config":
        args = ["trainer.max_train_stepz=3"]
        text = "trainer.max_train_stepz"
    elif case == "model":
        args = ["trainer.freeze_modules=[backbone.nothing]"]
        text = "backbone.nothing"
    else:  # run folder: a file where the folder should be
        (tmp_path / "blocked").write_text("")
        args = [f"run_root_dir={tmp_path / 'blocked' / 'runs'}"]
        text = "run_root_dir: cannot write to"
    rc, found = ascend.run(*args, capsys=capsys)
    assert rc == 1 and fails(found) == [expect], found
    assert text in found[expect][1], found[expect]


def test_warnings_do_not_fail(ascend, capsys, monkeypatch):
    ascend.free[2] = 26 * GIB  # 23.2 GiB planned: fits, but less than 4 GiB to spare
    monkeypatch.setattr(stack, "load_libraries", lambda names, path, *a: {n: None if path and "torch/lib" in path else
                                                                             f"{n}: cannot open shared object file"
                                                                             for n in names})
    rc, found = ascend.run("--num-machines", "2", capsys=capsys)
    assert rc == 0
    warned = {n: d for n, (s, d) in found.items() if s == "WARN"}
    assert set(warned) >= {"memory", "libraries"}, found
    assert "less than 4 GiB to spare" in warned["memory"]
    assert warned["libraries"].startswith("libc10.so, libtorch_npu.so load only with the launch library path")
    if run_config.file_system_type(ascend.tmp) in run_config.LOCAL_FILE_SYSTEMS:  # this host's tmp: ext4/overlay/tmpfs
        assert "nodes need one shared folder" in warned["run folder"]


def test_cuda_branches(monkeypatch, capsys, real_torch_import, tmp_path):
    monkeypatch.chdir(tmp_path)
    host = Ascend(monkeypatch, real_torch_import, tmp_path)
    host.versions = {}
    monkeypatch.setattr(device.api, "_npu_available", lambda: False)
    monkeypatch.setattr(device.api, "_cuda_available", lambda: True)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    monkeypatch.setattr(device.api, "device_count", lambda: 2)
    monkeypatch.setattr(probes, "fused_attention", lambda: ("WARN", "no fused SDPA kernel runs here"))
    device.reset_cache()
    rc, found = host.run(capsys=capsys)
    assert rc == 0, found
    assert found["torch_npu"] == ("SKIP", "not installed (no Ascend NPU stack here)")
    assert found["cards"] == ("PASS", "2 visible cuda card(s) (CUDA_VISIBLE_DEVICES=0,1) for 2 process(es) per node")
    assert found["collective"][1].startswith("all-reduce over nccl across 2 cuda card(s)")
    assert found["attention"][0] == "WARN"
    device.reset_cache()


def test_cpu_branches_for_real(monkeypatch, capsys):
    """The step and attention probes themselves, on this CPU; more CPU ranks than cores is a WARN."""
    monkeypatch.setenv("DIT4DIT_DEVICE", "cpu")
    device.reset_cache()
    probes.tiny_step(0)
    assert probes.fused_attention()[0] == "SKIP"
    monkeypatch.setattr(device.launch, "cpu_cores", lambda: 2)
    assert checks.check_cards(4).status == "WARN"
    assert checks.check_cards(2) == checks.Result("SKIP", "cards", "CPU host: 2 process(es) per node on 2 core(s), no cards")


# --------------------------------------------------------------------------------------------
# The stack's facts
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("torch_v, npu_v, ok", [
    ("2.7.1", "2.7.1", True), ("2.7.1+cpu", "2.7.1.post4", True), ("2.7.1", "2.7.1rc1", True),
    ("2.7.1", "2.7.0", False), ("2.6.0+cpu", "2.7.1.post2", False), ("2.10.0", "2.1.0.post17", False),
])
def test_the_torch_and_torch_npu_pair(torch_v, npu_v, ok):
    assert (stack.pair_problem(torch_v, npu_v) is None) is ok


def test_cann_version_is_read_from_the_toolkit(tmp_path):
    home = fake_cann(tmp_path / "latest", "8.3.RC1")
    assert stack.cann_toolkit({"ASCEND_HOME_PATH": str(home)}) == stack.Cann("8.3.RC1", home)
    assert stack.cann_toolkit({"ASCEND_HOME_PATH": str(tmp_path / "none")}) in (None, stack.cann_toolkit({}))


def test_explain_import_error_names_the_cause():
    old = "ImportError: libascendcl.so: cannot open shared object file: No such file or directory\n  torch_npu/__init__.py"
    assert "cannot load CANN's libascendcl.so" in stack.explain_import_error(old, None)
    assert stack.explain_import_error("Traceback ...\nModuleNotFoundError: No module named 'typing_extensions'", None) \
        == "import torch fails: ModuleNotFoundError: No module named 'typing_extensions'"


def test_a_config_that_does_not_load_is_its_fail_line(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(checks, "host_checks", lambda n, t: iter(()))  # the stack and host lines are not the point
    assert cmd.main(["--config", str(tmp_path / "nope.yaml")]) == 1
    found = parse(capsys.readouterr().out)
    assert found["config"] == ("FAIL", f"config file not found: {tmp_path / 'nope.yaml'}")


def test_the_counts_take_the_launch_scripts_spelling_too():
    """``--num_processes`` (scripts/train_8p.sh, accelerate) is ``--num-processes``: a flag copied
    from the launch line is the same count, not a stray config override."""
    dashed = cmd.parse_args(["--num-processes", "8", "--num-machines=2"])
    for argv in (["--num_processes=8", "--num_machines", "2"], ["--num_processes", "8", "--num-machines", "2"]):
        assert cmd.parse_args(argv) == dashed
    assert (dashed[0].num_processes, dashed[0].num_machines, dashed[1]) == (8, 2, [])
