"""Small builders for tests (ours and other packages'): a very small config and hand-made batches.

Nothing here touches data/ (the model never depends on the data pipeline); batches follow the
schema of ``dit4dit_npu/batch.py``.
"""

from __future__ import annotations

import torch

from dit4dit_npu.config import Config, load_config

INSTRUCTIONS = ["pick up the cup", "open the drawer", "stack the blocks", "press the button"]

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
    "framework.action_model.action_dim=6",
    "framework.action_model.state_dim=5",
    "framework.action_model.future_action_window_size=3",
    "framework.action_model.repeated_diffusion_steps=2",
    "datasets.vla_data.max_action_dim=6",
    "datasets.vla_data.max_state_dim=5",
    "datasets.vla_data.video_delta_indices=[0,1,2,3,4]",
    "datasets.vla_data.action_video_freq_ratio=1",
    "trainer.mixed_precision='no'",  # fp32 on CPU (quoted: YAML reads a bare no as false)
]


def small_config(*overrides: str) -> Config:
    return load_config(None, SMALL_OVERRIDES + list(overrides))


def make_batch(
    cfg: Config,
    batch_size: int = 2,
    num_frames: int = 5,
    num_views: int = 1,
    size: tuple[int, int] = (32, 32),
    seed: int = 0,
    training: bool = True,
) -> dict:
    """Random batch in the documented schema (uint8 frames, padded state/action, mask)."""
    g = torch.Generator().manual_seed(seed)
    a = cfg.framework.action_model
    d = cfg.datasets.vla_data
    h, w = size
    batch: dict = {
        "frames": torch.randint(
            0, 256, (batch_size, num_frames, num_views, 3, h, w), generator=g, dtype=torch.uint8
        ),
        "instruction": [INSTRUCTIONS[i % len(INSTRUCTIONS)] for i in range(batch_size)],
        "state": torch.randn(batch_size, d.max_state_dim, generator=g),
    }
    if training:
        batch["action"] = torch.rand(batch_size, a.chunk_length, d.max_action_dim, generator=g) * 2 - 1
        mask = torch.ones(batch_size, a.chunk_length, d.max_action_dim, dtype=torch.bool)
        batch["action_mask"] = mask
    return batch
