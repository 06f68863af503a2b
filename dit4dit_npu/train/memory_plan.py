"""Per-card memory of the real DiT4DiT training run: does it fit a 64 GB Ascend die, a 141 GB H200?

    python -m dit4dit_npu.train.memory_plan --config configs/robotwin/dit4dit_robotwin.yaml [--zero 2|3]
        [--world-size 8] [--batch 4] [--instructions N] [--cards 64 141] [--threads 2]   (dit4dit-memory-plan)
    python -m dit4dit_npu.train.memory_plan --smoke   # seconds: the tiny config, activations measured at tiny widths

The plan, per card, in GiB (card sizes are given in GB = 1e9 bytes, as vendors quote them):
- parameters: counted from the real module shapes on the meta device (Cosmos-Predict2.5-2B
  transformer, Wan2.1 VAE, the config's DiT-B head; Qwen2.5-VL-7B's language model for the
  start-up prompt encode), in the dtypes the trainer keeps: trained parameters fp32 (DeepSpeed's
  bf16 mode stays off, it would cast the fp32 head), the frozen VAE bf16 (accelerators);
- DeepSpeed ZeRO state as ``stage_1_and_2.py`` / ``stage3.py`` allocate it (fp32 master partition,
  AdamW's two fp32 moments, the gradient partition, the gradient buckets), with the bucket sizes of
  the DeepSpeed json (``trainer.deepspeed_config``, or ``configs/deepspeed/zero3.json`` for
  ``--zero 3``) and DeepSpeed's own defaults (its ``DeepSpeedZeroConfig``) for keys it omits;
  ``--zero 0`` is one card without DeepSpeed (whole gradients and moments), the shape of a
  single-card allocator check;
- the prompt cache: one 512 x 100352 bf16 embedding per instruction, on the card when the
  whole cache is <= 2 GiB (``dit4dit_npu/weights/prompt_cache.py``), else in host memory;
- the step's working memory, measured on this CPU with the real classes and extrapolated
  (``activations.py``): the VAE encode (skipped with a latent cache), the no-grad feature pass,
  and the video + action passes' forward end and backward peak, with and without gradient
  checkpointing; the step's peak is the largest phase, plus the batch's prompt embeddings.
Not modelled: the runtime's own reserve (context, communication workspaces) and allocator
fragmentation; keep a few GB of headroom.

Last line: ``speedup: X.XX`` = per-card memory without / with gradient checkpointing.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import time

import torch

from dit4dit_npu.batch import BatchSpec
from dit4dit_npu.config import Config, TinyCosmosConfig, load_config
from dit4dit_npu.data.mixture import mixture_entries
from dit4dit_npu.errors import DiT4DiTError
from dit4dit_npu.models.lora import is_adapter_key
from dit4dit_npu.train.activations import FULL_SIZE, QWEN_VOCAB, full_size_text_config
from dit4dit_npu.train.distributed import resolve_path
from dit4dit_npu.train.host_memory import host_terms, resident_bytes
from dit4dit_npu.transforms.policy_io import config_spec
from dit4dit_npu.weights.model_config import tiny_sizes
from dit4dit_npu.weights.prompt_cache import PROMPT_CACHE_ON_DEVICE_BYTES

os.environ.setdefault("KINETO_LOG_LEVEL", "5")  # quiet profiler sessions (set before torch loads kineto)

GIB = 2**30
TINY_CONFIG = "configs/robotwin/dit4dit_robotwin_tiny.yaml"  # --smoke's (a source checkout's configs/)
# RoboTwin's aloha-agilex: 14 absolute joints of state and of action (the width without padding).
ROBOTWIN_DIMS = 14


def plan_spec(cfg: Config) -> BatchSpec:
    """What the data side brings for ``cfg`` with RoboTwin's widths (the plan and the benches make
    random batches of this shape; no dataset is read)."""
    return config_spec(cfg, ROBOTWIN_DIMS, ROBOTWIN_DIMS)


def plan_widths(cfg: Config) -> TinyCosmosConfig:
    """The real model's widths at the depth of the config's base folder (a folder of fewer blocks,
    as bench/full_size_cpu.py trains, is planned at its own depth). The real 28 blocks where the
    config names no folder, or one that is not on this host (planning before the download), said."""
    from pathlib import Path

    c = cfg.framework.cosmos25
    if c.is_tiny:
        return FULL_SIZE
    if not Path(c.base_model).expanduser().exists():
        print(f"framework.cosmos25.base_model {c.base_model} is not on this host: planned at Cosmos-Predict2.5-2B's "
              f"{FULL_SIZE.num_layers} blocks")
        return FULL_SIZE
    from dit4dit_npu.weights import base_model_folder

    folder = base_model_folder(cfg, ("transformer",))
    config = folder / "transformer/config.json"
    try:
        blocks = int(json.loads(config.read_text())["num_layers"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DiT4DiTError(f"framework.cosmos25.base_model: {config}: expected a transformer config with num_layers "
                           f"({type(e).__name__}: {e})") from None
    return dataclasses.replace(FULL_SIZE, num_layers=blocks)


def meta_parts(cfg: Config, widths: TinyCosmosConfig = FULL_SIZE) -> dict[str, torch.nn.Module]:
    """The real modules of the run on the meta device (shapes only, no memory); under LoRA the
    transformer carries its adapters."""
    from diffusers import AutoencoderKLWan, CosmosTransformer3DModel
    from transformers import Qwen2_5_VLTextConfig, Qwen2_5_VLTextModel

    from dit4dit_npu.models import tiny as tiny_parts
    from dit4dit_npu.models.lora import add_lora
    from dit4dit_npu.weights import build_action_head
    from dit4dit_npu.weights.model_config import lora_adapter_config

    with torch.device("meta"):
        transformer = CosmosTransformer3DModel(**tiny_parts.transformer_kwargs(tiny_sizes(widths)))
        if cfg.framework.cosmos25.lora.enabled:
            add_lora(transformer, lora_adapter_config(cfg.framework.cosmos25.lora))
        parts = {
            "transformer": transformer,
            "vae": AutoencoderKLWan(),  # the class defaults are Wan2.1's
            "text_model": Qwen2_5_VLTextModel(Qwen2_5_VLTextConfig(**full_size_text_config(QWEN_VOCAB))),
        }
        if cfg.framework.cosmos25.training != "video":
            hidden = FULL_SIZE.num_attention_heads * FULL_SIZE.attention_head_dim
            parts["action_model"] = build_action_head(cfg, plan_spec(cfg), hidden)
    return parts


def parameter_counts(parts: dict[str, torch.nn.Module]) -> dict[str, int]:
    return {name: sum(p.numel() for p in m.parameters()) for name, m in parts.items()}


def zero_config(cfg: Config, stage: int) -> dict:
    """The json's zero_optimization section completed with DeepSpeed's defaults."""
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    path = cfg.trainer.deepspeed_config or "configs/deepspeed/zero2.json"
    if stage == 3 and "zero3" not in path:
        path = "configs/deepspeed/zero3.json"
    p = resolve_path(path)  # as the trainer finds it
    if not p.is_file():
        raise DiT4DiTError(f"trainer.deepspeed_config: file not found: {p}")
    section = json.loads(p.read_text()).get("zero_optimization", {})
    section["stage"] = stage
    return {"file": path, **DeepSpeedZeroConfig(**section).model_dump()}


def zero_rows(stage: int, world: int, groups: list[int], frozen: int, frozen_bytes: int, largest_leaf: int,
              small: tuple[int, int], ds: dict) -> list[tuple[str, float, str]]:
    """(row, bytes per card, how) of weights and optimizer state; ``groups`` = trainable parameters
    per optimizer group (each flattened and partitioned on its own), ``small`` = (trainable, frozen)
    parameters under ZeRO-3's persistence threshold (kept whole on every card)."""
    p = sum(groups)
    shard = sum(math.ceil(g / world) for g in groups)  # this card's partition of every group
    bucket = ds.get("reduce_bucket_size", 5e8)
    if stage == 0:
        return [
            ("trained weights (fp32)", 4 * p, f"{p / 1e9:.3f} B parameters"),
            ("frozen VAE (bf16)", frozen_bytes * frozen, f"{frozen / 1e6:.1f} M parameters"),
            ("gradients (fp32)", 4 * p, "whole, no DeepSpeed"),
            ("AdamW moments (2 x fp32)", 8 * p, "whole, no DeepSpeed"),
        ]
    if stage == 2:
        buffers = 2 if ds.get("overlap_comm") else 1
        return [
            ("trained weights (fp32)", 4 * p, f"{p / 1e9:.3f} B, whole on every card (ZeRO-2)"),
            ("frozen VAE (bf16)", frozen_bytes * frozen, f"{frozen / 1e6:.1f} M, not in the optimizer"),
            ("fp32 master partition", 4 * shard, "stage_1_and_2.py clones it even from fp32 weights"),
            ("AdamW moments (2 x fp32)", 8 * shard, f"1/{world} of {len(groups)} groups"),
            ("gradient partition (fp32)", 4 * shard, "contiguous_gradients" if ds.get("contiguous_gradients") else ""),
            ("gradient buckets (fp32)", 4 * buffers * bucket,
             f"{buffers} x reduce_bucket_size {bucket:.0e}" + (" (overlap_comm)" if buffers == 2 else "")),
        ]
    gathered = min(ds.get("max_live_parameters", 1e9), largest_leaf + ds.get("prefetch_bucket_size", 5e7))
    return [
        ("trained weights partition (fp32)", 4 * (shard + small[0]),
         f"1/{world}, + params < {ds.get('param_persistence_threshold', 1e5):.0e} whole"),
        ("frozen VAE partition (bf16)", frozen_bytes * (math.ceil(frozen / world) + small[1]), "ZeRO-3 partitions it too"),
        ("gathered weights in use (fp32)", 4 * gathered, "largest leaf module + prefetch bucket"),
        ("fp32 master partition", 0.0, "stage3.py reuses fp32 weights"),
        ("AdamW moments (2 x fp32)", 8 * shard, f"1/{world}"),
        ("gradient partition (fp32)", 4 * shard, "grad_partitions_flat_buffer"),
        ("gradient bucket (fp32)", 4 * bucket, f"reduce_bucket_size {bucket:.0e}"),
    ]


@dataclasses.dataclass(frozen=True)
class StepShape:
    """What the step's working memory depends on."""

    batch: int
    tokens: int  # video tokens: T_lat * h/2 * w/2 of the latent
    layers: int  # transformer blocks of the video pass
    feature_layers: int  # blocks of the feature pass (extract_layer + 1)
    text_tokens: int
    pixels: int  # per frame (H x W of the tiled frame)
    frames: int  # clip frames after padding to 1 + 4k

    @classmethod
    def of(cls, cfg: Config, batch: int, layers: int = FULL_SIZE.num_layers) -> StepShape:
        spec = plan_spec(cfg)
        h, w = spec.frame_size
        t_lat = (spec.num_frames - 1 + 3) // 4 + 1
        return cls(batch, t_lat * (h // 16) * (w // 16), layers, cfg.framework.cosmos25.extract_layer + 1,
                   cfg.framework.cosmos25.max_sequence_length, h * w, (t_lat - 1) * 4 + 1)


def text_width(widths: TinyCosmosConfig) -> int:
    """Width of a prompt embedding: every text-model layer's hidden state, concatenated."""
    return widths.text_num_layers * widths.text_hidden_size


def hidden_width(widths: TinyCosmosConfig) -> int:
    return widths.num_attention_heads * widths.attention_head_dim


def step_phases(fits: dict, head: dict, vae, s: StepShape, gc: bool, latent_cache: bool,
                widths: TinyCosmosConfig = FULL_SIZE, training: str = "joint") -> dict[str, float]:
    """Working memory of each phase of one training step, in bytes. Autograd runs the video graph's
    backward first (it was built last) while the head's graph waits, then the head's. The batch's
    prompt embeddings are alive all step (the transformer measurements include them). ``training:
    action`` has no video pass: the feature pass, then the head."""
    suffix = "_gc" if gc else ""
    b, n = s.batch, s.tokens
    prompts = b * s.text_tokens * text_width(widths) * 2  # the batch's bf16 prompt embeddings, alive all step
    features = b * n * hidden_width(widths) * 2  # bf16 output of block extract_layer, kept for the head
    phases = {"feature pass (no grad)": fits["features"](s.feature_layers, b, n)}
    if training != "action":
        phases["forward end (both graphs)"] = fits["fwd_end" + suffix](s.layers, b, n) + head["saved"](b, n) + features
        phases["video backward peak"] = fits["bwd_peak" + suffix](s.layers, b, n) + head["saved"](b, n) + features
    phases["action head backward peak"] = head["peak"](b, n) + features + prompts
    if not latent_cache:  # the uint8 clip, its bf16 VAE input and the encoder's activations
        phases["VAE encode (no grad)"] = vae(b, s.pixels) + b * s.frames * 3 * s.pixels * (1 + 2) + prompts
    return phases


def check(cfg: Config, fits: dict, head_fits: dict, batch: int, gc: bool,
          widths: TinyCosmosConfig = FULL_SIZE) -> tuple[float, float, StepShape]:
    """One real training step (forward + backward, from cached latents) of a real-width model,
    measured (the allocator's peak on an accelerator; on CPU the profiler's alloc/free high-water
    mark), against the plan's working memory for the same shape. On an accelerator: the full
    model at the real token count; on CPU: 3 blocks and 72 tokens (depth extrapolated from the
    1- and 2-block fits, the phases composed as in the plan)."""
    from dit4dit_npu import device as dev
    from dit4dit_npu.models import DiT4DiT
    from dit4dit_npu.models.prompt_cache import PromptCache
    from dit4dit_npu.train.activations import free_grads_on_accumulation, real_width_backbone, step_peak_mib
    from dit4dit_npu.weights import build_action_head
    from dit4dit_npu.weights.model_config import dit4dit_config
    from dit4dit_npu.weights.testing import make_batch

    full = dev.device_type() != dev.CPU
    spec = plan_spec(cfg)
    layers, (h, w) = (FULL_SIZE.num_layers, (spec.frame_size[0] // 8, spec.frame_size[1] // 8)) if full else (3, (8, 12))
    extract = cfg.framework.cosmos25.extract_layer if full else 1
    backbone = real_width_backbone(layers, extract, widths)
    if gc:
        backbone.transformer.enable_gradient_checkpointing()
    spec = dataclasses.replace(spec, frame_size=(8 * h, 8 * w))
    head = build_action_head(cfg, spec, hidden_width(widths))
    free_grads_on_accumulation(head)
    device = dev.get_device()
    model = DiT4DiT(backbone, head, dit4dit_config(cfg.framework), spec, autocast=True).to(device).train()
    model.backbone.vae.to(torch.bfloat16)
    text = cfg.framework.cosmos25.max_sequence_length
    cache = PromptCache()
    b = make_batch(spec, batch_size=batch)
    for instruction in b.instruction:
        cache.add(instruction, torch.randn(text, text_width(widths)).to(torch.bfloat16))
    model.set_prompt_cache(cache.to(device))
    t_lat = model.backbone.latent_frames(spec.num_frames)
    b = dataclasses.replace(b, frames=None, latents=torch.randn(batch, 16, t_lat, h, w, dtype=torch.bfloat16))

    def step() -> None:
        out = model(b)
        (out["action_loss"] + out["video_loss"]).backward()

    measured = step_peak_mib(step)[0] * 2**20
    shape = StepShape(batch, t_lat * h * w // 4, layers, extract + 1, text, 8 * h * 8 * w, 0)
    return measured, max(step_phases(fits, head_fits, None, shape, gc, True, widths).values()), shape


def fits_identity(cfg: Config, widths: TinyCosmosConfig, smoke: bool) -> dict:
    """What the activation fits depend on (a ``--fits`` file is reused only for the same): the
    widths, the text length, the head, and the batch's state, action and chunk widths the head is
    measured with (the config's transforms set them, not framework.action_model)."""
    spec = plan_spec(cfg)
    return {"widths": dataclasses.asdict(widths), "max_sequence_length": cfg.framework.cosmos25.max_sequence_length,
            "action_model": dataclasses.asdict(cfg.framework.action_model), "smoke": bool(smoke),
            "head_io": [spec.state_width, spec.action_width, spec.chunk_length]}


def measurements(cfg: Config, widths: TinyCosmosConfig, args: argparse.Namespace) -> tuple[dict, dict, object]:
    """The activation fits of the transformer, the action head and the VAE (minutes on CPU).
    They depend on the widths, the text length and the head, not on depth, batch, ZeRO or ranks:
    with ``--fits FILE`` they are read from FILE when it holds this config's, else measured and
    written there, so one measurement plans many runs (bench/full_size_cpu.py plans six)."""
    from dit4dit_npu.train.activations import (
        fits_from_json,
        fits_to_json,
        measure_head,
        measure_transformer,
        measure_vae,
    )
    from dit4dit_npu.weights import build_action_head

    c, spec = cfg.framework.cosmos25, plan_spec(cfg)
    identity = fits_identity(cfg, widths, args.smoke)
    if args.fits is not None and args.fits.is_file():
        try:
            saved = json.loads(args.fits.read_text())
            mine = saved.get("identity") == identity
            read = fits_from_json(saved) if mine else None
        except (ValueError, KeyError, TypeError, AttributeError) as e:  # garbage, or not a fits file: kept, never overwritten
            raise DiT4DiTError(f"--fits {args.fits}: not activation fits written by this planner ({type(e).__name__}: "
                               f"{' '.join(str(e).split())[:80]}); expected such a file, or a path that does not exist yet") from None
        if read is not None:
            print(f"activation fits: {args.fits} (measured for these widths, text length and head)")
            return read
        print(f"activation fits: {args.fits} holds another config's: measuring again")
    hidden = hidden_width(widths)
    print("measuring activations on CPU (real classes, reduced size):")
    fits = measure_transformer(c.max_sequence_length, text_width(widths), print, widths)
    head_fits = measure_head(build_action_head(cfg, spec, hidden), spec, hidden, print)
    from diffusers import AutoencoderKLWan

    from dit4dit_npu.models import tiny as tiny_parts

    vae_module = tiny_parts.build_vae(tiny_sizes(widths)) if args.smoke else AutoencoderKLWan()  # the class defaults are Wan2.1's
    vae = measure_vae(vae_module.to(torch.bfloat16).eval(), 9, print)
    residual = max([f.residual for f in fits.values()] + [f.residual for f in head_fits.values()] + [vae.residual])
    print(f"largest relative fit residual {100 * residual:.1f}%")
    if args.fits is not None:
        args.fits.parent.mkdir(parents=True, exist_ok=True)
        args.fits.write_text(json.dumps({"identity": identity, **fits_to_json(fits, head_fits, vae)}))
    return fits, head_fits, vae


def plan(args: argparse.Namespace) -> int:
    """The plan of ``args`` (the command's flags, checked by ``train/ops_cli.py``), printed; its last
    line is ``speedup: X.XX``."""
    # the widths the activations are measured at (the plan is always for the real model's shapes)
    widths = FULL_SIZE
    if args.smoke:
        args.config, args.threads, widths = str(resolve_path(TINY_CONFIG)), 1, TinyCosmosConfig()
    torch.set_num_threads(args.threads)
    cfg = load_config(args.config)
    batch = args.batch or cfg.datasets.vla_data.per_device_batch_size
    n_instr = args.instructions or len(mixture_entries(cfg.datasets.vla_data))

    # --host: this process, the training stack imported, before the planning's own allocations
    runtime = resident_bytes() if args.host else 0.0
    t0 = time.perf_counter()
    depth = plan_widths(cfg)  # the transformer's blocks: the base folder's (activations keep ``widths``)
    parts = meta_parts(cfg, depth)
    counts = parameter_counts(parts)
    c = cfg.framework.cosmos25
    adapters = sum(q.numel() for n, q in parts["transformer"].named_parameters() if is_adapter_key(n))
    head = [counts["action_model"]] if "action_model" in counts else []
    # what the optimizer holds: the whole transformer, its LoRA adapters, or nothing of it (action)
    trained = head if c.training == "action" else [adapters if c.lora.enabled else counts["transformer"]] + head
    leaf = max(sum(q.numel() for q in m.parameters(recurse=False)) for m in parts["transformer"].modules())
    ds = zero_config(cfg, args.zero) if args.zero else {"file": "none"}
    thr = ds.get("param_persistence_threshold", 1e5)
    trained_mods = [parts[k] for k in ("transformer", "action_model") if k in parts]
    small = (sum(q.numel() for m in trained_mods for q in m.parameters() if q.numel() < thr),
             sum(q.numel() for q in parts["vae"].parameters() if q.numel() < thr))
    print("parameters (meta device): " + ", ".join(f"{k} {v:,}" for k, v in counts.items()))

    fits, head_fits, vae = measurements(cfg, widths, args)
    print(f"parameters and measurements in {time.perf_counter() - t0:.0f} s")

    rows = zero_rows(args.zero, args.world_size, trained, counts["vae"], 2, leaf, small, ds)
    share = 1 if args.zero != 3 else args.world_size  # frozen weights: outside the optimizer, whole under ZeRO-2
    if c.training == "action":  # weights/build.py: the frozen transformer stays fp32 (its master dtype)
        rows.insert(1, ("frozen transformer (fp32)", 4 * counts["transformer"] / share, "training: action"))
    elif c.lora.enabled:  # weights/build.py: a LoRA base is frozen in the frozen parts' dtype
        n = counts["transformer"] - adapters
        rows.insert(1, ("frozen transformer (bf16)", 2 * n / share, f"{n / 1e9:.3f} B under {adapters / 1e6:.1f} M LoRA"))
    if (args.ema or cfg.trainer.ema.decay is not None) and args.zero == 3:
        raise DiT4DiTError("trainer.ema is refused under ZeRO-3 (no rank holds whole weights); plan it with --zero 2 or 0")
    if args.ema or cfg.trainer.ema.decay is not None:  # train/ema.py: fp32, each rank owns 1/world (ZeRO-2)
        share = args.world_size if args.zero else 1
        rows.append(("EMA of the trained weights (fp32)", 4 * sum(trained) / share, f"1/{share} per rank, trainer.ema"))
    cache = n_instr * cfg.framework.cosmos25.max_sequence_length * text_width(FULL_SIZE) * 2
    on_card = cache <= PROMPT_CACHE_ON_DEVICE_BYTES or args.host
    rows.append(("prompt cache (bf16)", cache if on_card else 0.0,
                 f"{n_instr} instructions x {cache / n_instr / 1e6:.0f} MB, " + ("on the card" if on_card and not args.host else "in host memory")))
    shape = StepShape.of(cfg, batch, depth.num_layers)
    phases = {k: step_phases(fits, head_fits, vae, shape, k == "gc", args.latent_cache, widths, c.training)
              for k in ("no_gc", "gc")}
    load = 0.0
    if args.host:
        rows, load = host_terms(rows, counts, trained, c.lora.enabled, runtime)
    resident = sum(r[1] for r in rows)
    peak = {k: max(v.values()) for k, v in phases.items()}
    total = {k: max(resident + v, load) for k, v in peak.items()}

    spec = plan_spec(cfg)
    print(f"\n== per-card memory: ZeRO-{args.zero} ({ds['file']}), world size {args.world_size}, batch {batch}, "
          f"{spec.num_frames} frames of {spec.frame_size[0]}x{spec.frame_size[1]}"
          f"{', latent cache' if args.latent_cache else ''} ==")
    print(f"{'component':<34} {'GiB':>8} {'GiB (GC)':>9}  note")
    for name, n, note in rows:
        print(f"{name:<34} {n / GIB:>8.2f} {n / GIB:>9.2f}  {note}")
    for name in phases["no_gc"]:
        a, b = phases["no_gc"][name], phases["gc"][name]
        print(f"  step: {name:<27} {a / GIB:>8.2f} {b / GIB:>9.2f}  incl. the batch's prompt embeddings")
    print(f"{'step working memory (peak phase)':<34} {peak['no_gc'] / GIB:>8.2f} {peak['gc'] / GIB:>9.2f}")
    if args.host:  # the larger of the two is the process's peak
        print(f"{'model load (host; peak if larger)':<34} {load / GIB:>8.2f} {load / GIB:>9.2f}  runtime, weights, "
              "the bf16 shards mapped while cast to fp32")
    print(f"{'total per card':<34} {total['no_gc'] / GIB:>8.2f} {total['gc'] / GIB:>9.2f}  "
          f"= {total['no_gc'] / 1e9:.1f} / {total['gc'] / 1e9:.1f} GB")
    for card in args.cards:
        verdict = {k: ("fits" if v <= card * 1e9 else "does NOT fit") for k, v in total.items()}
        print(f"{card:g} GB card: without gradient checkpointing {verdict['no_gc']} "
              f"({card - total['no_gc'] / 1e9:+.1f} GB), with it {verdict['gc']} ({card - total['gc'] / 1e9:+.1f} GB)")
    text, whole = counts["text_model"] * 2, 4 * (counts["transformer"] + counts.get("action_model", 0)) + 2 * counts["vae"]
    print(f"start-up, rank 0 only, before DeepSpeed takes the model (no optimizer state, no partitioning yet): the bf16 "
          f"text encoder ({text / GIB:.1f} GiB) next to the whole model ({whole / GIB:.1f} GiB); freed once the prompt "
          "cache is built")
    if args.json is not None:  # the total of the config's own gradient checkpointing setting first
        gc = cfg.trainer.enable_gradient_checkpointing
        args.json.write_text(json.dumps({
            "per_card_bytes": total["gc" if gc else "no_gc"], "gradient_checkpointing": gc,
            "total_bytes": total, "zero": args.zero, "world_size": args.world_size, "batch": batch,
        }))
    if args.check:
        for gc in (False, True):
            measured, planned, s = check(cfg, fits, head_fits, shape.batch, gc, widths)
            print(f"check ({'with' if gc else 'without'} gradient checkpointing, {s.layers} blocks, batch {s.batch}, "
                  f"{s.tokens} tokens): step working memory measured {measured / GIB:.2f} GiB, planned "
                  f"{planned / GIB:.2f} GiB ({100 * (planned / measured - 1):+.1f}%)")
    print("speedup = per-card memory without / with gradient checkpointing (the real config enables it)")
    print(f"speedup: {total['no_gc'] / total['gc']:.2f}")
    return 0


if __name__ == "__main__":  # python -m dit4dit_npu.train.memory_plan: the command is train/ops_cli.py's
    from dit4dit_npu.train.ops_cli import memory_plan_main

    raise SystemExit(memory_plan_main())
