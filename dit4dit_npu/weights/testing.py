"""Small builders for tests and benchmarks: a very small run config, its batch spec, and hand-made
batches. In weights/, not models/: it builds from a run config, which the models never see.

Nothing here touches data/ or PolicyIO (the model never depends on the data pipeline): batches
are random tensors in the ``Batch`` schema of ``dit4dit_npu/batch.py``, frames already tiled.
"""

from __future__ import annotations

import torch

from dit4dit_npu.batch import Batch, BatchSpec
from dit4dit_npu.config import Config, load_config

INSTRUCTIONS = ["pick up the cup", "open the drawer", "stack the blocks", "press the button"]

# The widths and clip length of the small setup (SMALL_OVERRIDES gives the data side the same
# values) and its tiled frame size.
STATE_WIDTH, ACTION_WIDTH, CLIP_FRAMES, FRAME_SIZE = 5, 6, 5, (32, 32)

# A model that builds in well under a second and steps in a few ms on one CPU thread.
SMALL_OVERRIDES = [
    "framework.cosmos25.base_model=tiny",
    "framework.cosmos25.tiny.num_layers=3",
    "framework.cosmos25.extract_layer=1",
    "framework.cosmos25.max_sequence_length=48",
    "framework.action_model.action_model_type=DiT-tiny",
    "framework.action_model.diffusion_model_cfg.num_layers=2",
    "framework.action_model.hidden_size=32",
    "framework.action_model.diffusion_model_cfg.output_dim=32",
    "framework.action_model.chunk_length=4",
    "framework.action_model.repeated_diffusion_steps=2",
    f"datasets.vla_data.max_action_dim={ACTION_WIDTH}",
    f"datasets.vla_data.max_state_dim={STATE_WIDTH}",
    f"datasets.vla_data.video_delta_indices={list(range(CLIP_FRAMES))}",
    "datasets.vla_data.action_video_freq_ratio=1",
    "trainer.mixed_precision='no'",  # fp32 on CPU (quoted: YAML reads a bare no as false)
]


def small_config(*overrides: str) -> Config:
    return load_config(None, SMALL_OVERRIDES + list(overrides))


def small_spec(
    cfg: Config,
    state_width: int = STATE_WIDTH,
    action_width: int = ACTION_WIDTH,
    num_frames: int = CLIP_FRAMES,
    frame_size: tuple[int, int] = FRAME_SIZE,
) -> BatchSpec:
    """The spec PolicyIO would promise for the small setup (chunk length from ``cfg``)."""
    chunk = cfg.framework.action_model.chunk_length
    return BatchSpec(state_width, action_width, chunk, num_frames, tuple(frame_size))


def make_batch(
    spec: BatchSpec,
    batch_size: int = 2,
    seed: int = 0,
    training: bool = True,
    num_frames: int | None = None,
) -> Batch:
    """Random batch fitting ``spec``: uint8 tiled frames, padded state/action, an all-True mask.
    ``training=False`` gives an observation (frame 0 only, no actions)."""
    g = torch.Generator().manual_seed(seed)
    t = num_frames or (spec.num_frames if training else 1)
    h, w = spec.frame_size
    frames = torch.randint(0, 256, (batch_size, t, 3, h, w), generator=g, dtype=torch.uint8)
    state = torch.randn(batch_size, spec.state_width, generator=g) if spec.state_width else None
    batch = Batch(frames, [INSTRUCTIONS[i % len(INSTRUCTIONS)] for i in range(batch_size)], state)
    if training:
        shape = (batch_size, spec.chunk_length, spec.action_width)
        batch.action = torch.rand(*shape, generator=g) * 2 - 1
        batch.action_mask = torch.ones(shape, dtype=torch.bool)
    return batch
