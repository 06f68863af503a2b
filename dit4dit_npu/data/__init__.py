"""Data layer: LeRobot v2.1/v3.0 reading, sample assembly, statistics, mixtures, validation, demo data.

    from dit4dit_npu.data import build_training_data
    from dit4dit_npu.batch import Batch
    data = build_training_data(cfg, rank, world_size, barrier)
    loader = DataLoader(data.train_dataset, batch_size=..., sampler=data.sampler, collate_fn=Batch.collate)

Modules: ``lerobot`` (LeRobotDataset), ``meta`` (its metadata), ``video`` (PyAV decode),
``robotwin`` (raw samples; PolicyIO turns them into model tensors), ``training_stats`` (statistics
of the training episodes), ``mixture`` (split + sampler), ``validate`` (every dataset check, as lists of
problems), ``build`` (config -> TrainingData), ``writer`` (arrays -> LeRobot files), ``demo`` and
``inspect`` (command-line tools). Exports are imported lazily so ``python -m
dit4dit_npu.data.demo`` / ``.inspect`` stay clean.
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
    from dit4dit_npu.data.robotwin import RawSample, RoboTwinDataset
    from dit4dit_npu.data.training_stats import compute_stats
    from dit4dit_npu.data.video import VideoDecoder

_EXPORTS = {
    "DatasetError": "errors",
    "LeRobotDataset": "lerobot",
    "LeRobotDatasetMetadata": "meta",
    "VideoDecoder": "video",
    "compute_stats": "training_stats",
    "MixtureSampler": "mixture",
    "split_episodes": "mixture",
    "RawSample": "robotwin",
    "RoboTwinDataset": "robotwin",
    "TrainingData": "build",
    "build_training_data": "build",
    "write_demo_dataset": "demo",
}

__all__ = [
    "DatasetError",
    "LeRobotDataset",
    "LeRobotDatasetMetadata",
    "MixtureSampler",
    "RawSample",
    "RoboTwinDataset",
    "TrainingData",
    "VideoDecoder",
    "build_training_data",
    "compute_stats",
    "split_episodes",
    "write_demo_dataset",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'dit4dit_npu.data' has no attribute {name!r}")
    return getattr(importlib.import_module(f"dit4dit_npu.data.{module}"), name)
