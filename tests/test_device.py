"""The device layer (dit4dit_npu/device/) on whatever host runs the suite: the detected branch for real, the others simulated.

The rest of the suite runs on CPU by default (conftest.py sets DIT4DIT_DEVICE=cpu); these tests
clear that so detection sees the real host: CPU here, CUDA on a GPU box, NPU on an Ascend box.
The CPU branch also runs for real on every host (forced), and the NPU/CUDA answers are checked on
any host by simulating the probes.
"""

import importlib.util
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dit4dit_npu import device
from dit4dit_npu.device.__main__ import main as device_main

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def fresh_detection(monkeypatch):
    monkeypatch.delenv("DIT4DIT_DEVICE", raising=False)
    device.reset_cache()
    yield
    device.reset_cache()


def simulate(monkeypatch, npu: bool, cuda: bool):
    monkeypatch.setattr(device.api, "_npu_available", lambda: npu)
    monkeypatch.setattr(device.api, "_cuda_available", lambda: cuda)
    device.reset_cache()


def host_kind() -> str:
    """What this host has, asked of torch (and torch_npu) directly, not through the device layer."""
    if importlib.util.find_spec("torch_npu") is not None:
        try:
            import torch_npu  # noqa: F401

            if torch.npu.is_available() and torch.npu.device_count() > 0:
                return "npu"
        except Exception:  # torch_npu without CANN: no NPU (what the device layer must conclude too)
            pass
    return "cuda" if torch.cuda.is_available() else "cpu"


def check_answers_for_real(kind: str):
    """Every answer the device layer gives for `kind`, exercised on the device itself."""
    assert device.device_type() == kind
    dev = device.get_device()
    assert dev.type == kind
    assert device.dist_backend() == {"npu": "hccl", "cuda": "nccl", "cpu": "gloo"}[kind]
    assert device.deepspeed_accelerator_name() == kind
    assert device.supports_fused_adamw() is (kind != "cpu")
    assert device.attention_backend_name() == ("_native_npu" if kind == "npu" else "native")
    a = torch.ones(2, 2, device=dev)
    with device.autocast():
        assert (a @ a).dtype == torch.bfloat16
    with device.autocast(enabled=False):
        assert (a @ a).dtype == torch.float32
    device.synchronize()
    device.empty_cache()
    stats = device.memory_stats()
    if kind == "cpu":
        assert device.device_count() == 1 and set(stats) == {"peak_rss_gib"}
    else:
        assert stats["allocated_gib"] > 0  # `a` lives there
        assert device.device_count() >= 1
        device.set_device()


def test_detected_host_branch_for_real():
    check_answers_for_real(host_kind())


def test_cpu_branch_for_real_on_every_host(monkeypatch):
    monkeypatch.setenv("DIT4DIT_DEVICE", "cpu")
    device.reset_cache()
    check_answers_for_real("cpu")
    assert device.get_device() == torch.device("cpu")


def test_npu_probe_matches_the_host_and_survives_a_broken_torch_npu(monkeypatch):
    assert device.api._npu_available() is (host_kind() == "npu")

    class Spec:  # torch_npu "installed" but its import raises (no CANN), on any host
        pass

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: Spec() if name == "torch_npu" else None)
    monkeypatch.setitem(sys.modules, "torch_npu", None)  # makes `import torch_npu` raise ImportError
    assert device.api._npu_available() is False


def test_detection_order(monkeypatch):
    simulate(monkeypatch, npu=True, cuda=True)
    assert device.device_type() == "npu"
    simulate(monkeypatch, npu=False, cuda=True)
    assert device.device_type() == "cuda"
    simulate(monkeypatch, npu=False, cuda=False)
    assert device.device_type() == "cpu"


def test_npu_answers(monkeypatch):
    simulate(monkeypatch, npu=True, cuda=False)
    assert device.dist_backend() == "hccl"
    assert device.attention_backend_name() == "_native_npu"
    assert device.attention_backend_name("flash") == "flash"
    assert device.supports_fused_adamw() is True
    assert device.deepspeed_accelerator_name() == "npu"
    assert device.autocast_device_type() == "npu"


def test_cuda_answers(monkeypatch):
    simulate(monkeypatch, npu=False, cuda=True)
    assert device.dist_backend() == "nccl"
    assert device.attention_backend_name() == "native"
    assert device.deepspeed_accelerator_name() == "cuda"


def test_forced_device(monkeypatch):
    monkeypatch.setenv("DIT4DIT_DEVICE", "cpu")
    simulate(monkeypatch, npu=True, cuda=True)
    assert device.device_type() == "cpu"
    monkeypatch.setenv("DIT4DIT_DEVICE", "tpu")
    device.reset_cache()
    with pytest.raises(device.DeviceError, match="DIT4DIT_DEVICE"):
        device.device_type()


def test_ascend_env_defaults_only_on_npu_and_never_override(monkeypatch):
    env = {"TASK_QUEUE_ENABLE": "1"}
    simulate(monkeypatch, npu=False, cuda=False)
    assert device.apply_env_defaults(env) == {}
    simulate(monkeypatch, npu=True, cuda=False)
    applied = device.apply_env_defaults(env)
    assert env["TASK_QUEUE_ENABLE"] == "1"  # the user's value wins
    assert applied == {"PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True", "CPU_AFFINITY_CONF": "1"}


def test_more_ranks_than_cards_fails_clearly(monkeypatch):
    simulate(monkeypatch, npu=True, cuda=False)
    monkeypatch.setattr(device.api, "device_count", lambda: 8)
    assert device.check_local_ranks(8) is None
    with pytest.raises(device.DeviceError, match=r"16 processes per node but only 8 visible npu card"):
        device.check_local_ranks(16)
    simulate(monkeypatch, npu=False, cuda=True)
    with pytest.raises(device.DeviceError, match=r"9 processes .* 8 visible cuda card.*CUDA_VISIBLE_DEVICES"):
        device.check_local_ranks(9)


def test_more_cpu_ranks_than_cores_is_a_warning_not_an_error(monkeypatch):
    simulate(monkeypatch, npu=False, cuda=False)
    monkeypatch.setattr(device.launch, "cpu_cores", lambda: 4)
    assert device.check_local_ranks(4) is None
    assert device.check_local_ranks(16) == (
        "warning: 16 CPU ranks per node but 4 core(s): the ranks will contend for cores "
        "(slower, not wrong); use --num_processes <= the core count"
    )


def test_launch_env_sets_ascend_variables_only_on_ascend_hosts(monkeypatch):
    assert device.library_paths()[0] == str(Path(torch.__file__).parent / "lib")
    libs = ":".join(device.library_paths())  # + torch_npu's lib folder where it is installed
    user = {"TASK_QUEUE_ENABLE": "1", "LD_LIBRARY_PATH": "/opt/mine"}
    for npu, cuda in ((False, False), (False, True)):
        simulate(monkeypatch, npu=npu, cuda=cuda)
        assert device.launch_env(dict(user)) == {"LD_LIBRARY_PATH": f"{libs}:/opt/mine"}
    simulate(monkeypatch, npu=True, cuda=False)
    assert device.launch_env(dict(user)) == {
        "PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True",
        "CPU_AFFINITY_CONF": "1",  # TASK_QUEUE_ENABLE is the user's: not exported again
        "LD_LIBRARY_PATH": f"{libs}:/opt/mine",
    }
    assert device.launch_env({})["LD_LIBRARY_PATH"] == libs


def test_cli_rank_check_is_one_line_with_exit_code_2(monkeypatch, capsys):
    simulate(monkeypatch, npu=True, cuda=False)
    monkeypatch.setattr(device.api, "device_count", lambda: 8)
    assert device_main(["env", "--ranks", "16"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.strip().splitlines() == [
        "error: 16 processes per node but only 8 visible npu card(s): use --num_processes <= 8 "
        "(one rank per physical card; check ASCEND_RT_VISIBLE_DEVICES)"
    ]
    for bad in ("0", "-1", "2.5", "two", ""):
        assert device_main(["env", "--ranks", bad]) == 2
        assert capsys.readouterr().err.strip().splitlines() == [
            f"error: --ranks={bad!r}: expected a positive integer (ranks per node)"
        ]
    assert device_main(["bogus"]) == 2 and "usage:" in capsys.readouterr().err


@pytest.mark.slow
def test_cli_prints_this_hosts_exports_for_real():
    """`python -m dit4dit_npu.device env` as the launch script runs it, on the real host."""
    env = {k: v for k, v in os.environ.items() if k not in ("DIT4DIT_DEVICE", *device.ASCEND_ENV_DEFAULTS)}
    r = subprocess.run(
        [sys.executable, "-m", "dit4dit_npu.device", "env", "--ranks", "1"],
        env=env, capture_output=True, text=True, cwd=ROOT, timeout=120,
    )
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines and all(line.startswith("export ") for line in lines)
    exported = dict(shlex.split(line.removeprefix("export "))[0].split("=", 1) for line in lines)
    ascend = set(device.ASCEND_ENV_DEFAULTS) & set(exported)
    assert ascend == (set(device.ASCEND_ENV_DEFAULTS) if host_kind() == "npu" else set())
    assert exported["LD_LIBRARY_PATH"].split(":")[0] == str(Path(torch.__file__).parent / "lib")


def test_seed_everything_is_reproducible():
    device.seed_everything(3)
    a = torch.rand(3)
    device.seed_everything(3)
    assert torch.equal(a, torch.rand(3))


def test_attention_context_scopes_the_backend():
    from diffusers.models.attention_dispatch import _AttentionBackendRegistry

    before = _AttentionBackendRegistry.get_active_backend()
    with device.attention_context("_native_math"):
        assert _AttentionBackendRegistry.get_active_backend()[0].value == "_native_math"
    assert _AttentionBackendRegistry.get_active_backend() == before


def test_a_user_named_device_is_checked_against_the_host(monkeypatch):
    simulate(monkeypatch, npu=False, cuda=False)
    assert device.parse_device("cpu") == torch.device("cpu")
    for text, message in (("cuda", "this host has no cuda (detected: cpu)"),
                          ("npu:0", "this host has no npu (detected: cpu)"),
                          ("bogus", "expected cpu, or npu/cuda with an optional :index")):
        with pytest.raises(device.DeviceError, match=re.escape(f"device {text!r}: {message}")):
            device.parse_device(text)
    simulate(monkeypatch, npu=False, cuda=True)
    monkeypatch.setattr(device.api, "device_count", lambda: 2)
    assert device.parse_device("cuda:1") == torch.device("cuda", 1)
    with pytest.raises(device.DeviceError, match="this host has 2 cuda card"):
        device.parse_device("cuda:2")


def test_eval_refuses_a_device_the_host_lacks_in_one_line(monkeypatch, capsys):
    """Was a RuntimeError traceback from torch after the policy had loaded."""
    from dit4dit_npu.eval.cli import main as eval_main

    monkeypatch.setenv("DIT4DIT_DEVICE", "cpu")
    device.reset_cache()
    assert eval_main(["--policy", "nowhere", "--device", "cuda"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "error: --device: device 'cuda': this host has no cuda (detected: cpu)", err
