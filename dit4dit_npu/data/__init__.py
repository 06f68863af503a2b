"""Data layer: LeRobot v2.1/v3.0 reading, RoboTwin samples, normalization, mixtures, demo data.

    from dit4dit_npu.data import build_training_data, collate
    data = build_training_data(cfg, rank, world_size, barrier)
    loader = DataLoader(data.train_dataset, batch_size=..., sampler=data.sampler, collate_fn=collate)

Modules: ``lerobot`` (LeRobotDataset), ``meta`` (its metadata), ``video`` (PyAV decode/resize),
``robotwin`` (samples + collate), ``normalize`` (Normalizer), ``mixture`` (split + sampler),
``build`` (config -> TrainingData), ``writer`` (arrays -> LeRobot files), ``demo`` and
``inspect`` (command-line tools).
Exports are imported lazily so ``python -m dit4dit_npu.data.demo`` / ``.inspect`` stay clean.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dit4dit_npu.data.build import TrainingData, build_training_data
    from dit4dit_npu.data.demo import write_demo_dataset
    from dit4dit_npu.data.errors import DatasetError
    from dit4dit_npu.data.lerobot import LeRobotDataset
    from dit4dit_npu.data.meta import LeRobotDatasetMetadata
    from dit4dit_npu.data.mixture import MixtureSampler, split_episodes
    from dit4dit_npu.data.normalize import FeatureStats, Normalizer, compute_stats, merge_stats, pad_to
    from dit4dit_npu.data.robotwin import RoboTwinDataset, collate
    from dit4dit_npu.data.video import VideoDecoder, resize_rgb

_EXPORTS = {
    "DatasetError": "errors",
    "LeRobotDataset": "lerobot",
    "LeRobotDatasetMetadata": "meta",
    "VideoDecoder": "video",
    "resize_rgb": "video",
    "FeatureStats": "normalize",
    "Normalizer": "normalize",
    "compute_stats": "normalize",
    "merge_stats": "normalize",
    "pad_to": "normalize",
    "MixtureSampler": "mixture",
    "split_episodes": "mixture",
    "RoboTwinDataset": "robotwin",
    "collate": "robotwin",
    "TrainingData": "build",
    "build_training_data": "build",
    "write_demo_dataset": "demo",
}

__all__ = [
    "DatasetError",
    "FeatureStats",
    "LeRobotDataset",
    "LeRobotDatasetMetadata",
    "MixtureSampler",
    "Normalizer",
    "RoboTwinDataset",
    "TrainingData",
    "VideoDecoder",
    "build_training_data",
    "collate",
    "compute_stats",
    "merge_stats",
    "pad_to",
    "resize_rgb",
    "split_episodes",
    "write_demo_dataset",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'dit4dit_npu.data' has no attribute {name!r}")
    return getattr(importlib.import_module(f"dit4dit_npu.data.{module}"), name)
