"""device.py: the CPU branch for real; NPU/CUDA branches by simulating the probes."""

import pytest
import torch

from dit4dit_npu import device


@pytest.fixture(autouse=True)
def fresh_detection(monkeypatch):
    monkeypatch.delenv("DIT4DIT_DEVICE", raising=False)
    device.reset_cache()
    yield
    device.reset_cache()


def simulate(monkeypatch, npu: bool, cuda: bool):
    monkeypatch.setattr(device, "_npu_available", lambda: npu)
    monkeypatch.setattr(device, "_cuda_available", lambda: cuda)
    device.reset_cache()


def test_cpu_branch_for_real():
    assert device.device_type() == "cpu"  # no accelerator on this machine
    assert device.get_device() == torch.device("cpu")
    assert device.dist_backend() == "gloo"
    assert device.supports_fused_adamw() is False
    assert device.attention_backend_name() == "native"
    with device.autocast():
        y = torch.ones(2, 2) @ torch.ones(2, 2)
    assert y.dtype == torch.bfloat16
    with device.autocast(enabled=False):
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32
    assert "peak_rss_gib" in device.memory_stats()
    device.synchronize()
    device.empty_cache()


def test_npu_probe_survives_missing_or_broken_torch_npu(monkeypatch):
    import importlib.util

    assert importlib.util.find_spec("torch_npu") is None
    assert device._npu_available() is False

    class Spec:  # torch_npu "installed" but its import raises (no CANN)
        pass

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: Spec() if name == "torch_npu" else None)
    assert device._npu_available() is False


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
    monkeypatch.setattr(device, "device_count", lambda: 8)
    device.check_local_ranks(8)
    with pytest.raises(device.DeviceError, match=r"16 processes per node but only 8 visible npu card"):
        device.check_local_ranks(16)
    simulate(monkeypatch, npu=False, cuda=False)
    device.check_local_ranks(16)  # CPU ranks are processes: fine


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
