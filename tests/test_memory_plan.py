"""The memory planner (``dit4dit_npu/train/memory_plan.py``, ``dit4dit-memory-plan``): its parameter counts are the real config's module shapes (meta device vs an
independent count from the same configs), and its ZeRO-2 accounting is what DeepSpeed allocates."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REAL = ROOT / "configs/robotwin/dit4dit_robotwin.yaml"


@pytest.fixture(scope="module")
def memory():
    from dit4dit_npu.train import memory_plan

    return memory_plan


def cosmos_transformer_params(c: dict) -> int:
    """Cosmos-Predict2.5 transformer parameters from its config, written out from the architecture:
    per block self-attention q/k/v/o and cross-attention q/o (d x d,
    no bias), cross-attention k/v (text_embed_dim x d), q/k RMSNorms per head dim, a 4x GELU FFN,
    three AdaLN-LoRA norms (d x r + r x 3d); then the text projection, the time embedding, the patch
    embedding and the output AdaLN-LoRA + projection."""
    d = c["num_attention_heads"] * c["attention_head_dim"]
    r, e, hd = c["adaln_lora_dim"], c["text_embed_dim"], c["attention_head_dim"]
    mlp = int(c["mlp_ratio"] * d)
    pt, ph, pw = c["patch_size"]
    block = 6 * d * d + 2 * e * d + 4 * hd + 2 * d * mlp + 3 * (d * r + r * 3 * d)
    proj = c["crossattn_proj_in_channels"] * c["encoder_hidden_states_channels"] + c["encoder_hidden_states_channels"]
    time_embed = d * d + d * 3 * d + d
    patch = (c["in_channels"] + int(c["concat_padding_mask"])) * pt * ph * pw * d
    out = d * r + r * 2 * d + d * c["out_channels"] * pt * ph * pw
    return c["num_layers"] * block + proj + time_embed + patch + out


def qwen_text_params(c: dict) -> int:
    """Qwen2 decoder: embeddings, per layer q/k/v (with bias, grouped K/V) and o (no bias), a gated
    MLP, two RMSNorms; a final RMSNorm."""
    h, i, heads, kv = c["hidden_size"], c["intermediate_size"], c["num_attention_heads"], c["num_key_value_heads"]
    kv_dim = kv * h // heads
    layer = (h * h + h) + 2 * (h * kv_dim + kv_dim) + h * h + 3 * h * i + 2 * h
    return c["vocab_size"] * h + c["num_hidden_layers"] * layer + h


def test_parameter_counts_are_the_real_module_shapes(memory):
    from dit4dit_npu.config import load_config
    from dit4dit_npu.models import tiny
    from dit4dit_npu.train.activations import FULL_SIZE, QWEN_VOCAB, full_size_text_config

    counts = memory.parameter_counts(memory.meta_parts(load_config(REAL)))
    assert counts["transformer"] == cosmos_transformer_params(tiny.transformer_kwargs(FULL_SIZE)) == 2_059_174_912
    assert counts["text_model"] == qwen_text_params(full_size_text_config(QWEN_VOCAB)) == 7_070_619_136
    # Wan2.1's VAE: the parameter count of its diffusers-format folder
    assert counts["vae"] == 126_892_531
    assert 100e6 < counts["action_model"] < 200e6  # DiT-B, 16 layers, hidden 2560 (built from the config)


DEEPSPEED_PROBE = r"""
import json, torch, deepspeed, deepspeed.ops
from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder
from dit4dit_npu.train.memory_plan import zero_rows
# no JIT build of the CPU shared-memory all-reduce (unused in training; train/distributed.py does the same)
deepspeed.ops.__compatible_ops__[ShareMemCommBuilder.NAME] = False
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(300, 200), torch.nn.Linear(200, 50), torch.nn.Linear(50, 7))
model[0].requires_grad_(False)  # a frozen module stays out of the optimizer, as the VAE
groups = [{"params": list(model[1].parameters()), "lr": 1e-3}, {"params": list(model[2].parameters()), "lr": 1e-4}]
ds = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "bf16": {"enabled": False},
      "zero_optimization": {"stage": 2, "overlap_comm": True, "contiguous_gradients": True,
                            "reduce_bucket_size": 4096, "allgather_bucket_size": 4096}}
engine, opt, _, _ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(
    [dict(g) for g in groups]), config=ds)
zo = engine.optimizer
measured = {}

def during_backward(_):  # the buckets live from the start of backward to its end
    measured["gradient buckets (fp32)"] = sum(
        b.numel() * b.element_size() for k in zo.ipg_buckets for b in zo.ipg_buckets[k].buffer)

model[1].weight.register_post_accumulate_grad_hook(during_backward)
loss = engine(torch.randn(2, 300)).square().mean()
engine.backward(loss)
measured["fp32 master partition"] = sum(t.numel() * 4 for t in zo.single_partition_of_fp32_groups)
measured["gradient partition (fp32)"] = sum(g.numel() * 4 for gs in zo.averaged_gradients.values() for g in gs)
engine.step()
measured["AdamW moments (2 x fp32)"] = sum(
    s[k].numel() * 4 for s in zo.optimizer.state.values() for k in ("exp_avg", "exp_avg_sq"))
sizes = [sum(p.numel() for p in g["params"]) for g in groups]
rows = {name: n for name, n, _ in zero_rows(2, 1, sizes, 300 * 200 + 200, 4, 0, (0, 0),
                                            {"reduce_bucket_size": 4096, "overlap_comm": True, "contiguous_gradients": True})}
print(json.dumps({"measured": measured, "planned": {k: rows[k] for k in measured}}))
"""


@pytest.mark.slow
def test_zero2_accounting_matches_what_deepspeed_allocates(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "DIT4DIT_DEVICE": "cpu", "OMP_NUM_THREADS": "1",
           "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-c", DEEPSPEED_PROBE], env=env, cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    # alignment padding aside (DeepSpeed pads each flat group to a multiple of 2 x its NCCL alignment)
    for name, n in out["measured"].items():
        assert out["planned"][name] <= n <= out["planned"][name] + 4 * 64, (name, out)


def test_a_json_path_under_a_file_or_a_folder_is_one_line_before_measuring(tmp_path, capsys):
    # was a NotADirectoryError traceback at the end, after the minutes of measuring
    from dit4dit_npu.train.ops_cli import memory_plan_main as main

    a_file = tmp_path / "a_file"
    a_file.write_text("kept")
    for path, what in ((a_file / "plan.json", f"{a_file} is a file"), (tmp_path, f"{tmp_path} is a folder")):
        assert main(["--smoke", "--json", str(path)]) == 2
        [line] = capsys.readouterr().err.strip().splitlines()
        assert line.startswith(f"error: --json {path}: {what}"), line
    assert a_file.read_text() == "kept"


def test_the_plan_is_of_the_base_folders_depth(memory, tmp_path):
    # bench/full_size_cpu.py trains a base folder of 2 real-width blocks: the plan was of 28 blocks whatever the folder
    from dit4dit_npu.config import load_config

    folder = tmp_path / "base"
    (folder / "transformer").mkdir(parents=True)
    (folder / "transformer/config.json").write_text(json.dumps({"num_layers": 2}))
    shallow = load_config(REAL, [f"framework.cosmos25.base_model={folder}"])
    assert memory.plan_widths(shallow).num_layers == 2
    assert memory.plan_widths(load_config(REAL)).num_layers == 28  # the real config names no folder: the real depth
    counts = memory.parameter_counts(memory.meta_parts(shallow, memory.plan_widths(shallow)))
    assert counts["transformer"] == 259_805_184  # 2 of the 2,059,174,912's blocks and all the rest


def test_lora_adapters_are_what_the_optimizer_holds(memory):
    # a LoRA run was planned as full training: 2B fp32 weights with AdamW moments (33 GB more than it holds)
    from dit4dit_npu.config import load_config
    from dit4dit_npu.models.lora import is_adapter_key

    cfg = load_config(REAL, ["framework.cosmos25.lora.rank=16"])
    transformer = memory.meta_parts(cfg)["transformer"]
    adapters = sum(p.numel() for n, p in transformer.named_parameters() if is_adapter_key(n))
    assert 0 < adapters < 0.02 * 2_059_174_912
    assert sum(p.numel() for p in transformer.parameters()) == 2_059_174_912 + adapters


def test_training_action_has_no_video_pass_in_its_step(memory):
    from dit4dit_npu.train.activations import BackwardFit, DepthFit, Fit

    one = Fit(1.0, 0.0, 0.0, 0.0)
    depth = DepthFit(one, one)
    fits = {"features": depth, "fwd_end": depth, "fwd_end_gc": depth,
            "bwd_peak": BackwardFit(depth, one, one), "bwd_peak_gc": BackwardFit(depth, one, one)}
    shape = memory.StepShape(1, 100, 28, 18, 512, 224 * 672, 9)
    joint = memory.step_phases(fits, {"saved": one, "peak": one}, one, shape, True, True)
    action = memory.step_phases(fits, {"saved": one, "peak": one}, one, shape, True, True, training="action")
    assert "video backward peak" in joint and "forward end (both graphs)" in joint
    assert set(action) == {"feature pass (no grad)", "action head backward peak"}


def test_a_host_process_holds_the_runtime_and_only_the_bucket_pages_written():
    from dit4dit_npu.train.host_memory import host_terms

    rows = [("trained weights (fp32)", 4e6, ""), ("fp32 master partition", 4e6, ""),
            ("gradient buckets (fp32)", 4e9, "2 x reduce_bucket_size"), ("prompt cache (bf16)", 1e6, "")]
    out, load = host_terms(rows, {"transformer": 10**6}, [10**6], lora=False, runtime=8e8)
    got = {name: n for name, n, _ in out}
    assert got["runtime (measured)"] == 8e8
    assert got["gradient buckets (fp32)"] == 4e6  # torch.empty: resident only where gradients were written
    assert load == 8e8 + 4e6 + 2e6  # the weights beside their bf16 shards, mapped while cast
    assert host_terms(rows, {"transformer": 10**6}, [10**6], lora=True, runtime=8e8)[1] == 8e8 + 4e6


def test_activation_fits_round_trip_through_json(memory):
    from dit4dit_npu.train.activations import BackwardFit, DepthFit, Fit, fits_from_json, fits_to_json

    a, b = Fit(1.0, 2.0, 3.0, 0.01), Fit(4.0, 5.0, 6.0, 0.02)
    transformer = {"features": DepthFit(a, b), "bwd_peak_gc": BackwardFit(DepthFit(b, a), a, b)}
    saved = json.loads(json.dumps(fits_to_json(transformer, {"peak": a}, b)))
    assert fits_from_json(saved) == (transformer, {"peak": a}, b)


@pytest.mark.slow
def test_fits_are_measured_once_and_reused(tmp_path, capsys):
    from dit4dit_npu.train.ops_cli import memory_plan_main as main

    fits = tmp_path / "fits.json"
    assert main(["--smoke", "--host", "--fits", str(fits)]) == 0
    assert "measuring activations" in capsys.readouterr().out and fits.is_file()
    assert main(["--smoke", "--host", "--fits", str(fits), "--batch", "2"]) == 0
    out = capsys.readouterr().out
    assert "measuring activations" not in out and f"activation fits: {fits}" in out


@pytest.mark.parametrize("text", ["{garbage", "[1, 2]", '{"identity": null, "transformer": 3}', "\udcff"])
def test_a_fits_file_that_is_not_fits_is_one_line_and_kept(memory, tmp_path, text):
    # was a JSONDecodeError / AttributeError traceback, after the parameter counts
    import argparse

    from dit4dit_npu.config import load_config
    from dit4dit_npu.errors import DiT4DiTError

    bad = tmp_path / "fits.json"
    bad.write_bytes(text.encode("utf-8", "surrogateescape"))
    cfg = load_config(REAL)
    args = argparse.Namespace(fits=bad, smoke=True)
    if text.startswith('{"identity"'):  # this config's identity over a body that is no fits
        bad.write_text(json.dumps({"identity": memory.fits_identity(cfg, memory.FULL_SIZE, True), "transformer": 3}))
    before = bad.read_bytes()
    with pytest.raises(DiT4DiTError, match=f"^--fits {bad}: not activation fits written by this planner") as e:
        memory.measurements(cfg, memory.FULL_SIZE, args)
    assert "\n" not in str(e.value)
    assert bad.read_bytes() == before  # kept as it was, not overwritten by a new measurement


def test_fits_of_another_state_width_are_not_reused(memory):
    # the head is measured at the batch's state/action/chunk widths, which the transforms set: a
    # --fits file measured for a sincos state (twice the width) was reused for a min_max one
    from dit4dit_npu.config import load_config

    a = memory.fits_identity(load_config(REAL), memory.FULL_SIZE, False)
    b = memory.fits_identity(load_config(REAL, ["datasets.vla_data.state_norm=sincos"]), memory.FULL_SIZE, False)
    assert memory.plan_spec(load_config(REAL)).state_width != memory.plan_spec(
        load_config(REAL, ["datasets.vla_data.state_norm=sincos"])).state_width
    assert a != b


def test_a_base_folder_without_a_readable_depth_is_one_line(memory, tmp_path):
    from dit4dit_npu.config import load_config
    from dit4dit_npu.errors import DiT4DiTError

    folder = tmp_path / "base"
    (folder / "transformer").mkdir(parents=True)
    for text in ("{not json", json.dumps({"num_layers": None}), json.dumps({"width": 3})):
        (folder / "transformer/config.json").write_text(text)
        with pytest.raises(DiT4DiTError, match="transformer/config.json: expected a transformer config with num_layers"):
            memory.plan_widths(load_config(REAL, [f"framework.cosmos25.base_model={folder}"]))
