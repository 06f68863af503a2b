"""``predict_action`` latency per stage: our inference path vs the reference-faithful one.

    python bench/latency.py [--iters 20] [--batch-size 1] [--threads 2] [--full-size]

Stages (device synchronised between them): preprocess (validation, resize, state encoding),
text (prompt-cache lookup; the reference runs the text encoder on every call, SPEC B1), VAE encode
of the conditioning frame (the reference encodes it zero-padded to the clip length, B4), feature
pass (ours stops after ``extract_layer``; the reference runs every block and the output head, B3),
action sampling (the Euler steps of the head), postprocess (unnormalize to robot units).

Runs, in one process:
1. the tiny config (``configs/robotwin/dit4dit_robotwin_tiny.yaml``): our path only;
2. the medium config (``bench/medium.yaml``, real proportions at CPU scale): ours vs reference,
   alternating call by call on the same model (the switches are runtime flags) so machine noise
   hits both alike;
3. with ``--full-size`` (meant for a lent accelerator): the real architecture with random weights
   (Cosmos-Predict2.5-2B transformer, Wan2.1 VAE, a 28 x 3584 Qwen2.5-VL text model), backbone in
   bf16, 3 views of 224 x 224 from 240 x 320 camera frames; reports Hz.

Before timing, the staged call is checked against ``policy.predict_action`` (same output), so the
stages cannot drift from the real path. The last line is ``speedup: X.XX`` = reference p50 /
ours p50 of the total on the medium config (or on the full-size model when it ran).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dit4dit_npu import device as dev
from dit4dit_npu.config import Config, load_config
from dit4dit_npu.data.normalize import FeatureStats, Normalizer
from dit4dit_npu.models import DiT4DiT, PromptCache, build_dit4dit, build_prompt_encoder
from dit4dit_npu.policy import DiT4DiTPolicy

REPO = Path(__file__).resolve().parents[1]
STAGES = ("preprocess", "text", "vae_encode", "feature_pass", "action_sampling", "postprocess")
INSTRUCTION = "lift the red block with the left arm"


class Laps:
    def __init__(self) -> None:
        dev.synchronize()
        self.t = time.perf_counter()
        self.times: dict[str, float] = {}

    def lap(self, name: str) -> None:
        dev.synchronize()
        now = time.perf_counter()
        self.times[name] = now - self.t
        self.t = now


@torch.inference_mode()
def staged_predict(policy: DiT4DiTPolicy, obs: dict[str, Any], seed: int) -> tuple[np.ndarray, dict[str, float]]:
    """``DiT4DiTPolicy.predict_action`` split into its stages (same calls as DiT4DiT.predict_action)."""
    m: DiT4DiT = policy.model
    laps = Laps()
    batch, batched = policy.preprocess(obs)
    laps.lap("preprocess")
    prompts = m.prompt_embeddings(batch["instruction"])
    laps.lap("text")
    cond = m._condition(m.video_input(batch["frames"][:, :1]), None)
    laps.lap("vae_encode")
    with dev.autocast(enabled=m.autocast_enabled):
        feats, _ = m._features(cond, prompts, m._feature_seed(seed), grad=False)
    laps.lap("feature_pass")
    g = torch.Generator().manual_seed(seed)
    normalized = m.action_model.sample(feats, batch["state"].to(m.device), g)
    laps.lap("action_sampling")
    out = policy.postprocess(normalized, batched)
    laps.lap("postprocess")
    return out, laps.times


def set_path(policy: DiT4DiTPolicy, path: str, encoder: Any) -> None:
    ref = path == "reference"
    m = policy.model
    m.cosmos = dataclasses.replace(
        policy.cfg.framework.cosmos25,
        reference_text_encoder_per_step=ref,
        reference_full_depth_feature_pass=ref,
        reference_separate_condition_encode=ref,
    )
    m.prompt_encoder = encoder if ref else None


def synthetic_normalizer(cfg: Config) -> Normalizer:
    a = cfg.framework.action_model
    rng = np.random.default_rng(0)
    return Normalizer(
        FeatureStats.from_data(rng.normal(size=(256, a.action_dim))),
        FeatureStats.from_data(rng.normal(size=(256, a.state_dim))),
        cfg.datasets.vla_data.action_norm,
        cfg.datasets.vla_data.state_norm,
        warn=False,
    )


def make_policy(cfg: Config, model: DiT4DiT, encoder: Any) -> DiT4DiTPolicy:
    cache = PromptCache()
    cache.build([INSTRUCTION], encoder)
    info = {"step": 0, "base_model": cfg.framework.cosmos25.base_model}
    return DiT4DiTPolicy(model.eval(), cfg, synthetic_normalizer(cfg), cache, info)


def make_obs(policy: DiT4DiTPolicy, batch_size: int, camera_hw: tuple[int, int] | None) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    h, w = camera_hw or policy.image_size
    shape = (batch_size, h, w, 3) if batch_size > 1 else (h, w, 3)
    obs: dict[str, Any] = {k: rng.integers(0, 256, shape, dtype=np.uint8) for k in policy.camera_keys}
    state = rng.normal(size=(batch_size, policy.state_dim) if batch_size > 1 else (policy.state_dim,))
    obs.update(state=state.astype(np.float32), instruction=INSTRUCTION)
    return obs


def measure(
    policy: DiT4DiTPolicy, obs: dict[str, Any], paths: list[str], iters: int, encoder: Any
) -> dict[str, dict[str, list[float]]]:
    times = {p: {s: [] for s in (*STAGES, "total")} for p in paths}
    for path in paths:
        set_path(policy, path, encoder)
        torch.manual_seed(0)  # the reference conditioning encode samples the VAE posterior
        want = policy.predict_action(obs, seed=0)
        torch.manual_seed(0)
        got, _ = staged_predict(policy, obs, 0)  # also the warm-up
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=f"staged {path} path drifted")
    for i in range(iters):
        for path in paths:
            set_path(policy, path, encoder)
            _, t = staged_predict(policy, obs, i)
            for s in STAGES:
                times[path][s].append(t[s])
            times[path]["total"].append(sum(t.values()))
    set_path(policy, "ours", encoder)
    return times


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs) * 1e3, q))


def report(title: str, times: dict[str, dict[str, list[float]]], batch_size: int) -> None:
    print(f"\n== {title} (batch {batch_size}; ms, p50 / p95) ==")
    paths = list(times)
    print(f"{'stage':<16}" + "".join(f"{p:>22}" for p in paths))
    for s in (*STAGES, "total"):
        print(f"{s:<16}" + "".join(f"{pct(times[p][s], 50):>11.2f} /{pct(times[p][s], 95):>9.2f}" for p in paths))
    for p in paths:
        p50 = statistics.median(times[p]["total"])
        print(f"{p}: {1.0 / p50:.1f} Hz ({batch_size / p50:.1f} observations/s)")


# --------------------------------------------------------------------------------------------
# Full-size random model (real architecture, no weights)
# --------------------------------------------------------------------------------------------


def build_full_size(cfg: Config, device: torch.device, dtype: torch.dtype, layers: int = 28) -> tuple[DiT4DiT, Any]:
    """Cosmos-Predict2.5-2B transformer + Wan2.1 VAE + a Qwen2.5-VL-7B-sized text model, random,
    built directly on ``device`` (cosmos25_tiny_recipe.md §1 configs). The tokenizer is the tiny
    one: its vocabulary only changes the embedding table, not the per-token compute. ``layers``
    < 28 keeps every width but fewer blocks (a CPU smoke test of this builder)."""
    from diffusers import AutoencoderKLWan, CosmosTransformer3DModel
    from transformers import Qwen2_5_VLTextConfig, Qwen2_5_VLTextModel

    from dit4dit_npu.config import TinyCosmosConfig
    from dit4dit_npu.models import CosmosBackbone, PromptEncoder, build_action_head, clip_frames
    from dit4dit_npu.models import tiny as tiny_parts

    c = cfg.framework.cosmos25
    real = TinyCosmosConfig(
        num_layers=layers, num_attention_heads=16, attention_head_dim=128, text_embed_dim=1024,
        adaln_lora_dim=256, vae_base_dim=96, text_hidden_size=3584, text_num_layers=layers, text_num_heads=28,
    )
    if c.extract_layer >= layers:
        c = dataclasses.replace(c, extract_layer=layers - 1)
        cfg.framework.cosmos25 = c
    with torch.device(device):
        transformer = CosmosTransformer3DModel(**tiny_parts.transformer_kwargs(real)).to(dtype)
        vae = AutoencoderKLWan().to(dtype)  # the class defaults are Wan2.1's
        tok = tiny_parts.build_tokenizer()
        text = Qwen2_5_VLTextModel(
            Qwen2_5_VLTextConfig(
                vocab_size=len(tok), hidden_size=3584, intermediate_size=18944, num_hidden_layers=layers,
                num_attention_heads=28, num_key_value_heads=4, rope_theta=1e6, max_position_embeddings=2048,
                rope_scaling={"mrope_section": [16, 24, 24], "rope_type": "default", "type": "default"},
                bos_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
            )
        ).to(dtype)
    backbone = CosmosBackbone(
        transformer, vae, tiny_parts.build_scheduler(), c.conditional_frame_timestep, c.flow_matching, c.attention_backend
    )
    head = build_action_head(cfg, backbone.hidden_size).to(device)
    encoder = PromptEncoder(tok, text, c.max_sequence_length, identity="full-size-random")
    model = DiT4DiT(
        backbone, head, c, feature_latent_frames=backbone.latent_frames(clip_frames(cfg)), autocast_enabled=True
    )
    return model, encoder


# --------------------------------------------------------------------------------------------


def run_config(
    title: str, cfg: Config, args: argparse.Namespace, paths: list[str],
    build: Callable[[], tuple[DiT4DiT, Any]], camera_hw: tuple[int, int] | None = None,
) -> dict[str, dict[str, list[float]]]:
    t0 = time.perf_counter()
    model, encoder = build()
    policy = make_policy(cfg, model, encoder)
    print(f"\n{title}: built in {time.perf_counter() - t0:.1f} s, "
          f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters (+ text encoder)")
    times = measure(policy, make_obs(policy, args.batch_size, camera_hw), paths, args.iters, encoder)
    report(title, times, args.batch_size)
    return times


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--iters", type=int, default=20, help="timed calls per path (after a warm-up)")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--medium", default=str(REPO / "bench" / "medium.yaml"))
    p.add_argument("--full-size", action="store_true", help="also the real-size random model (accelerator)")
    p.add_argument("--full-size-paths", default="ours,reference", help="paths for --full-size")
    p.add_argument("--full-size-layers", type=int, default=28, help=argparse.SUPPRESS)  # smoke tests only
    p.add_argument("--skip-small", action="store_true", help="skip the tiny and medium configs")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    dev.seed_everything(0)
    device = dev.get_device()
    print(f"device: {dev.describe()}  threads={args.threads}")

    def builder(cfg: Config) -> Callable[[], tuple[DiT4DiT, Any]]:
        return lambda: (build_dit4dit(cfg).to(device), build_prompt_encoder(cfg).to(device))

    times: dict[str, dict[str, list[float]]] = {}
    if not args.skip_small:
        tiny = load_config(REPO / "configs" / "robotwin" / "dit4dit_robotwin_tiny.yaml")
        run_config("tiny", tiny, args, ["ours"], builder(tiny))
        medium = load_config(args.medium)
        times = run_config("medium", medium, args, ["ours", "reference"], builder(medium))
    if args.full_size:
        full = load_config(REPO / "configs" / "robotwin" / "dit4dit_robotwin.yaml")
        dtype = torch.float32 if dev.device_type() == dev.CPU and full.trainer.mixed_precision == "no" else torch.bfloat16
        paths = [s for s in args.full_size_paths.split(",") if s]
        full_times = run_config("full-size (random weights)", full, args, paths,
                                lambda: build_full_size(full, device, dtype, args.full_size_layers),
                                camera_hw=(240, 320))
        if "reference" in full_times and "ours" in full_times:
            times = full_times
    if "reference" in times:
        ours, ref = statistics.median(times["ours"]["total"]), statistics.median(times["reference"]["total"])
        print(f"speedup: {ref / ours:.2f}")


if __name__ == "__main__":
    main()
