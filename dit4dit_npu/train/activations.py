"""Activation memory of a DiT4DiT training step, measured on CPU with the real classes at reduced
size and extrapolated to the real one (``memory_plan.py`` composes the plan).

Every measurement runs the production code path (``CosmosBackbone.video_flow_matching_loss`` /
``.features``, ``FlowMatchingActionHead.loss``, ``models.cosmos.vae_latents``) under the bf16
autocast the trainer uses, and reads torch's ``MemTracker`` (every tensor allocation and free):
the module's forward-end and backward peak snapshots, or the region's peak, always without the
parameters (resident; planned separately). Gradients are freed the moment they are accumulated,
as DeepSpeed does when it copies them into its buckets, so only one is ever transient.

What is reduced and how it is scaled back:
- the video transformer has the real config (2048 wide, 16 heads, text projection from 100352,
  512 text tokens) but 1 or 2 blocks and fewer video tokens S (a smaller latent, T_lat kept):
  the forward end and the memory backward starts with are fitted as intercept(B, S) +
  L * per_block(B, S), each of those as c + B * (a + b * S) (c holds the bf16 weight copies
  autocast keeps, which do not grow with the batch), and evaluated at the real depth and token
  count; the backward peak is that start plus one block's backward (its own snapshots), or the
  tail of the backward (the text projection's weight gradient), whichever is larger;
- the feature pass (no grad) the same way, at its depth (extract_layer + 1 blocks);
- the action head is the real one from the config, on fewer feature tokens;
- the Wan2.1 VAE (real, bf16) encodes 9 frames at reduced resolution, fitted linear in pixels
  (its peak read from the profiler's alloc/free events: MemTracker refuses modules called
  several times per pass, as the causal VAE's chunks are).
Attention runs through torch SDPA (flash kernel on CPU), whose memory is linear in S as on the
accelerators' fused kernels; the fits report their largest residual.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import torch
from torch.distributed._tools.mem_tracker import MemTracker, _ModState

from dit4dit_npu import device as dev
from dit4dit_npu.config import Cosmos25Config, TinyCosmosConfig
from dit4dit_npu.models import tiny as tiny_parts
from dit4dit_npu.models.cosmos import CosmosBackbone
from dit4dit_npu.models.vae import vae_latents
from dit4dit_npu.weights.model_config import backbone_config, tiny_sizes
from dit4dit_npu.weights.real_size import FULL_SIZE, QWEN_VOCAB, full_size_text_config  # noqa: F401 (re-exported)

PARAM_KEYS = ("Parameter", "Buffer")
POINTS = ((1, 4, 12), (1, 8, 12), (2, 4, 12), (2, 8, 12))  # (batch, latent h, latent w); T_lat = 3
T_LAT = 3


def _bytes(snapshot: dict) -> int:
    """A MemTracker snapshot's total over devices, without parameters and buffers."""
    total = 0
    for per_device in snapshot.values():
        for kind, n in per_device.items():
            name = getattr(kind, "value", kind)
            if name not in PARAM_KEYS and name != "Total":
                total += n
    return total


def free_grads_on_accumulation(module: torch.nn.Module) -> None:
    for p in module.parameters():
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(lambda p: setattr(p, "grad", None))


@dataclasses.dataclass
class Fit:
    """value(B, S) = c + B * (a + b * S), least squares, with its largest relative residual."""

    c: float
    a: float
    b: float
    residual: float

    def __call__(self, batch: float, tokens: float) -> float:
        return self.c + batch * (self.a + self.b * tokens)

    @classmethod
    def of(cls, rows: list[tuple[int, int, float]]) -> Fit:
        x = np.array([[1.0, b, b * s] for b, s, _ in rows])
        y = np.array([v for _, _, v in rows])
        coef = np.linalg.lstsq(x, y, rcond=None)[0]
        res = max(abs(x @ coef - y) / np.maximum(abs(y), 1.0))
        return cls(*coef.tolist(), float(res))


@dataclasses.dataclass
class DepthFit:
    """value(L, B, S) = base(B, S) + L * per_block(B, S)."""

    base: Fit
    per_block: Fit

    def __call__(self, layers: int, batch: float, tokens: float) -> float:
        return self.base(batch, tokens) + layers * self.per_block(batch, tokens)

    @property
    def residual(self) -> float:
        return max(self.base.residual, self.per_block.residual)


def _depth_fit(samples: dict[int, list[tuple[int, int, float]]]) -> DepthFit:
    """From measurements at L = 1 and 2 (same (B, S) points in the same order)."""
    one, two = samples[1], samples[2]
    per_block = [(b, s, v2 - v1) for (b, s, v1), (_, _, v2) in zip(one, two)]
    base = [(b, s, v1 - d) for (b, s, v1), (_, _, d) in zip(one, per_block)]
    return DepthFit(Fit.of(base), Fit.of(per_block))


def real_width_backbone(layers: int, extract_layer: int, widths: TinyCosmosConfig | None = None) -> CosmosBackbone:
    """The real Cosmos-Predict2.5-2B transformer config (or ``widths``: the planner's --smoke)
    with ``layers`` blocks (random weights), composed like the trained model; its VAE is a tiny
    one (the VAE is measured separately)."""
    sizes = dataclasses.replace(widths or FULL_SIZE, num_layers=layers, vae_base_dim=8)
    transformer = tiny_parts.build_transformer(tiny_sizes(sizes))
    vae = tiny_parts.build_vae(tiny_sizes(sizes))
    backbone = CosmosBackbone(
        transformer, vae, tiny_parts.build_scheduler(), backbone_config(Cosmos25Config(extract_layer=extract_layer))
    )
    free_grads_on_accumulation(backbone.transformer)
    return backbone


@dataclasses.dataclass
class BackwardFit:
    """Backward peak at depth L: the larger of (what backward starts with + one block's backward,
    recompute included under checkpointing) and the tail (the text projection's weight gradient
    and the last blocks, measured at one block)."""

    start: DepthFit
    block: Fit
    tail: Fit

    def __call__(self, layers: int, batch: float, tokens: float) -> float:
        return max(self.start(layers, batch, tokens) + self.block(batch, tokens), self.tail(batch, tokens))

    @property
    def residual(self) -> float:
        return max(self.start.residual, self.block.residual, self.tail.residual)


def measure_transformer(
    max_text: int, text_width: int, log: Callable[[str], None], widths: TinyCosmosConfig | None = None
) -> dict:
    """Fits of the video pass (forward end incl. the autocast weight cache; backward peak; with and
    without gradient checkpointing) and of the no-grad feature pass, at the real widths (or
    ``widths``)."""
    keys = ("post_fw", "pre_bw", "block_bw", "tail")
    raw = {f"{k}{g}": {1: [], 2: []} for k in keys for g in ("", "_gc")} | {"features": {1: [], 2: []}}
    for layers in (1, 2):
        bb = real_width_backbone(layers, layers - 1, widths)
        tr = bb.transformer
        for batch, h, w in POINTS:
            tokens = T_LAT * h * w // 4
            lat = torch.randn(batch, 16, T_LAT, h, w)
            for gc in (False, True):
                if gc:
                    tr.enable_gradient_checkpointing()
                else:
                    tr.disable_gradient_checkpointing()
                mt = MemTracker()
                with mt:
                    # the batch's prompt embeddings are made inside the step (the cache lookup), bf16
                    prompts = torch.randn(batch, max_text, text_width, dtype=torch.bfloat16)
                    with dev.autocast():
                        loss = bb.video_flow_matching_loss(lat, prompts)
                    loss.backward()
                root, block = mt.memory_tracking[tr].snapshots, mt.memory_tracking[tr.transformer_blocks[0]].snapshots
                g = "_gc" if gc else ""
                values = {
                    "post_fw": _bytes(root[_ModState.POST_FW][-1]),
                    "pre_bw": _bytes(root[_ModState.PRE_BW][-1]),
                    "block_bw": _bytes(block[_ModState.PEAK_BW][-1]) - _bytes(block[_ModState.PRE_BW][-1]),
                    "tail": _bytes(root[_ModState.PEAK_BW][-1]),
                }
                for k, v in values.items():
                    raw[k + g][layers].append((batch, tokens, v))
            mt = MemTracker()
            with mt, torch.no_grad(), dev.autocast():
                prompts = torch.randn(batch, max_text, text_width, dtype=torch.bfloat16)
                bb.features(lat[:, :, :1], prompts, T_LAT)
            raw["features"][layers].append((batch, tokens, _bytes(mt.get_tracker_snapshot("peak"))))
            log(f"  transformer L={layers} B={batch} S={tokens}: measured")
        del bb, tr
    fits: dict = {"features": _depth_fit(raw["features"])}
    for g in ("", "_gc"):
        fits["fwd_end" + g] = _depth_fit(raw["post_fw" + g])
        fits["bwd_peak" + g] = BackwardFit(
            _depth_fit(raw["pre_bw" + g]), Fit.of(raw["block_bw" + g][1] + raw["block_bw" + g][2]),
            Fit.of(raw["tail" + g][1]),
        )
    return fits


def measure_head(head: torch.nn.Module, spec, hidden: int, log: Callable[[str], None]) -> dict[str, Fit]:
    """The real action head on features of S tokens: its saved state after forward, and its peak."""
    free_grads_on_accumulation(head)
    saved, peak = [], []
    for batch, tokens in ((1, 144), (1, 576), (2, 144), (2, 576)):
        feats = torch.randn(batch, tokens, hidden, dtype=torch.bfloat16)
        state = torch.randn(batch, spec.state_width) if spec.state_width else None
        action = torch.randn(batch, spec.chunk_length, spec.action_width)
        mask = torch.ones_like(action, dtype=torch.bool)
        mt = MemTracker()
        with mt:
            with dev.autocast():
                loss = head.loss(feats, state, action, mask)
            saved.append((batch, tokens, _bytes(mt.get_tracker_snapshot("current"))))
            loss.backward()
        peak.append((batch, tokens, _bytes(mt.get_tracker_snapshot("peak"))))
        log(f"  action head B={batch} S={tokens}: measured")
    return {"saved": Fit.of(saved), "peak": Fit.of(peak)}


def measure_vae(vae: torch.nn.Module, frames: int, log: Callable[[str], None]) -> Fit:
    """Peak of one no-grad encode of a ``frames``-frame clip (B = 1), as c + pixels * b (Fit with
    batch 1: the caller scales the per-pixel part by the batch)."""
    rows = []
    for h, w in ((32, 96), (48, 144), (64, 192)):
        video = torch.rand(1, 3, frames, h, w) * 2 - 1
        # (MemTracker refuses modules called several times per pass, as the VAE's causal chunks are)
        rows.append((1, h * w, step_peak_mib(lambda: vae_latents(vae, video))[0] * 2**20))  # noqa: B023
        log(f"  VAE {frames} frames of {h}x{w}: measured")
    return _pixels_fit(rows)


def _pixels_fit(rows: list[tuple[int, int, float]]) -> Fit:
    x = np.array([[1.0, p] for _, p, _ in rows])
    y = np.array([v for _, _, v in rows])
    c, b = np.linalg.lstsq(x, y, rcond=None)[0]
    res = max(abs(x @ np.array([c, b]) - y) / y)
    return Fit(float(c), 0.0, float(b), float(res))


def fits_to_json(transformer: dict, head: dict[str, Fit], vae: Fit) -> dict:
    """The measured fits as plain numbers (``memory_plan.py --fits``: measure once, plan many)."""
    return {"transformer": {k: dataclasses.asdict(v) for k, v in transformer.items()},
            "head": {k: dataclasses.asdict(v) for k, v in head.items()}, "vae": dataclasses.asdict(vae)}


def fits_from_json(d: dict) -> tuple[dict, dict[str, Fit], Fit]:
    """The inverse of ``fits_to_json``."""
    def depth(x: dict) -> DepthFit:
        return DepthFit(Fit(**x["base"]), Fit(**x["per_block"]))

    transformer = {k: BackwardFit(depth(v["start"]), Fit(**v["block"]), Fit(**v["tail"])) if k.startswith("bwd_peak")
                   else depth(v) for k, v in d["transformer"].items()}
    return transformer, {k: Fit(**v) for k, v in d["head"].items()}, Fit(**d["vae"])


def step_peak_mib(fn: Callable[[], object]) -> tuple[float, str]:
    """Peak memory that ``fn`` adds on top of what was live before it (activations, gradients,
    temporaries), in MiB, and how it was measured.

    Accelerator: the caching allocator's peak minus what was allocated at the start. CPU: torch
    keeps no allocator statistics there (and peak RSS is dominated by the ~1 GB of mapped torch
    libraries), so we replay the profiler's per-allocation memory events (every torch CPU
    alloc/free with its size and time) and take the high-water mark of their running sum.
    """
    if dev.device_type() != dev.CPU:
        dev.synchronize()
        base = dev.memory_stats()["allocated_gib"]
        dev.reset_peak_memory()
        fn()
        dev.synchronize()
        return (dev.memory_stats()["peak_allocated_gib"] - base) * 1024, "allocator peak"
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    live = peak = 0
    for e in sorted(events, key=lambda e: e.start_ns()):
        live += e.nbytes()
        peak = max(peak, live)
    return peak / 2**20, "profiler alloc/free events"
