"""The stages of bench/full_size_cpu.py that are no command of their own, each run as a fresh
process by it (so its peak RSS is its own):

    _full_size_child.py prompts CONFIG OVERRIDES...   the prompt cache of the demo data's instructions
    _full_size_child.py predict POLICY bf16|fp32 TEXT  from_pretrained + predict_action, timed
    _full_size_child.py check POLICY                   from_pretrained, default vs full content check
    _full_size_child.py client PORT TEXT               one dit4dit_client round trip to a running server
    _full_size_child.py convert-check RUN POLICY       the to-dit4dit checkpoint's keys and shapes vs the
                                                       original's module tree, built on the meta device
"""

from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path

import numpy as np
import torch


def rss() -> str:
    return f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB"


def observation(policy, instruction: str, seed: int = 0) -> dict:
    """A robot observation of the policy's contract (an instruction it was trained on: no text encoder)."""
    rng = np.random.default_rng(seed)
    h, w = policy.image_size
    obs = {k: rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for k in policy.camera_keys}
    obs["state"] = rng.uniform(-1, 1, policy.state_dim).astype(np.float32)
    obs["instruction"] = instruction
    return obs


def prompts(config: str, overrides: list[str]) -> None:
    from dit4dit_npu.config import load_config
    from dit4dit_npu.models.prompt_cache import PromptCache
    from dit4dit_npu.weights import build_prompt_encoder
    from dit4dit_npu.weights.prompt_cache import save_prompt_cache

    cfg = load_config(config, overrides)
    root = Path(cfg.datasets.vla_data.data_root_dir)
    tasks = [json.loads(line)["task"] for f in root.glob("*/meta/tasks.jsonl") for line in f.read_text().splitlines()]
    t0 = time.perf_counter()
    encoder = build_prompt_encoder(cfg)
    n = sum(p.numel() for p in encoder.language_model.parameters())
    print(f"text encoder loaded in {time.perf_counter() - t0:.1f} s ({n / 1e9:.2f} B parameters, "
          f"{next(encoder.language_model.parameters()).dtype}); {rss()}")
    t0 = time.perf_counter()
    cache = PromptCache()
    cache.build(tasks, encoder)
    print(f"{len(tasks)} instruction(s) encoded in {time.perf_counter() - t0:.1f} s; {rss()}")
    del encoder  # released: training never holds the text encoder
    save_prompt_cache(cache, cfg.framework.cosmos25.prompt_cache)


def predict(policy_dir: str, dtype: str, instruction: str) -> None:
    from dit4dit_npu.policy import DiT4DiTPolicy

    t0 = time.perf_counter()
    policy = DiT4DiTPolicy.from_pretrained(policy_dir, backbone_dtype=torch.bfloat16 if dtype == "bf16" else None)
    print(f"from_pretrained: {time.perf_counter() - t0:.1f} s; {rss()}")
    obs = observation(policy, instruction)
    t0 = time.perf_counter()
    actions = policy.predict_action(obs, seed=0)
    print(f"predict_action #1: {time.perf_counter() - t0:.2f} s, actions {np.asarray(actions).shape}; {rss()}")
    assert np.isfinite(np.asarray(actions)).all()
    from _common import INFER_STAGES, Timer, staged_predict  # (the script's folder: bench/)

    # the second call: the same calls one by one (bench/profile_medium.py's staging), each timed
    timer = Timer()
    with torch.inference_mode(), policy.held_model([instruction]) as model:
        actions = staged_predict(model, policy.io, obs, 1, timer)
    assert np.isfinite(np.asarray(actions)).all()
    print("predict_action #2, per stage: " + ", ".join(f"{s} {timer.t[s]:.2f} s" for s in INFER_STAGES)
          + f" (total {sum(timer.t.values()):.2f} s); {rss()}")


def check(policy_dir: str) -> None:
    from dit4dit_npu.policy import DiT4DiTPolicy

    for full in (False, True):
        t0 = time.perf_counter()
        DiT4DiTPolicy.from_pretrained(policy_dir, full_check=full)
        print(f"from_pretrained(full_check={full}): {time.perf_counter() - t0:.1f} s; {rss()}")


def client(port: str, instruction: str) -> None:
    """The robot side: only dit4dit_client (no torch model); the observation from the server's metadata."""
    from dit4dit_client import WebsocketClientPolicy

    t0 = time.perf_counter()
    with WebsocketClientPolicy("127.0.0.1", int(port), connect_timeout_s=3600, request_timeout_s=3600) as c:
        print(f"connected after {time.perf_counter() - t0:.1f} s (the server loading the policy)")
        meta = c.get_server_metadata()
        rng = np.random.default_rng(0)
        h, w = meta["image_size"]
        obs = {k: rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for k in meta["camera_keys"]}
        obs |= {"state": rng.uniform(-1, 1, meta["state_dim"]).astype(np.float32), "instruction": instruction, "seed": 0}
        t0 = time.perf_counter()
        actions = c.infer(obs)["actions"]
    print(f"round trip: {time.perf_counter() - t0:.2f} s, actions {np.asarray(actions).shape}; {rss()}")
    assert np.isfinite(np.asarray(actions)).all()


def convert_check(run: str, policy_dir: str) -> None:
    """Every tensor of the exported checkpoint against the original DiT4DiT's module tree, built
    on the meta device from the same classes and configs its code builds (the Cosmos transformer,
    Wan VAE and Qwen2.5-VL of the base folder under its ``backbone_interface.extractor`` names, the
    action head under ``action_model``): the same keys and shapes, nothing missing or extra."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    from dit4dit_npu.config.dit4dit_keys import original_path
    from dit4dit_npu.convert.checkpoint import HEAD, TEXT_ENCODER, TRANSFORMER, VAE
    from dit4dit_npu.policy.folder import read_io, read_manifest, read_policy_json
    from dit4dit_npu.policy.manifest import inference_config
    from dit4dit_npu.transforms.policy_io import config_spec
    from dit4dit_npu.weights import base_model_folder, build_skeleton

    ckpt = next(Path(run, "checkpoints").glob("steps_*_pytorch_model.pt"))
    t0 = time.perf_counter()
    state = torch.load(ckpt, map_location="cpu", mmap=True, weights_only=True)
    got = {k: tuple(v.shape) for k, v in state.items()}
    print(f"{ckpt.name}: {ckpt.stat().st_size / 1e9:.2f} GB, {len(got)} tensors, read (mmap) in {time.perf_counter() - t0:.1f} s")
    path = Path(policy_dir)
    io = read_io(path)
    cfg = inference_config(read_manifest(path, read_policy_json(path), io).model)
    base = base_model_folder(cfg)
    skeleton = build_skeleton(cfg, config_spec(cfg, io.state_dim, io.action_dim))
    want = {TRANSFORMER + k: tuple(v.shape) for k, v in skeleton.backbone.transformer.state_dict().items()}
    want |= {VAE + k: tuple(v.shape) for k, v in skeleton.backbone.vae.state_dict().items()}
    want |= {original_path("action_model." + k): tuple(v.shape) for k, v in skeleton.action_model.state_dict().items()}
    with torch.device("meta"):
        text = Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig.from_pretrained(str(base / "text_encoder")))
    want |= {TEXT_ENCODER + k: tuple(v.shape) for k, v in text.state_dict().items()}
    assert all(k.startswith((TRANSFORMER, VAE, TEXT_ENCODER, HEAD)) for k in want)
    missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
    shapes = [k for k in set(want) & set(got) if want[k] != got[k]]
    print(f"keys: {len(want)} expected, {len(missing)} missing {missing[:3]}, {len(extra)} extra {extra[:3]}, "
          f"{len(shapes)} of another shape {shapes[:3]}; {rss()}")
    if missing or extra or shapes:
        raise SystemExit(1)


if __name__ == "__main__":
    mode, rest = sys.argv[1], sys.argv[2:]
    torch.set_num_threads(int(__import__("os").environ.get("OMP_NUM_THREADS", "2")))
    {"prompts": lambda: prompts(rest[0], rest[1:]), "predict": lambda: predict(*rest), "check": lambda: check(*rest),
     "client": lambda: client(*rest), "convert-check": lambda: convert_check(*rest)}[mode]()
