"""Builders shared by the policy / serve / eval tests: a tiny model on the generated demo
dataset, exported with the real ``export_policy`` (no mocks anywhere)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dit4dit_npu.config import Config, load_config

TINY_YAML = Path(__file__).resolve().parents[1] / "configs" / "robotwin" / "dit4dit_robotwin_tiny.yaml"


def tiny_config(root: Path, *overrides: str) -> Config:
    """The embedded tiny config with its demo data (written here: the trainer generates it only
    at its default location) and runs under ``root``."""
    from dit4dit_npu.data.demo import write_demo_dataset

    if not (root / "data" / "robotwin_demo").exists():
        write_demo_dataset(root / "data" / "robotwin_demo")
    return load_config(
        TINY_YAML,
        [f"datasets.vla_data.data_root_dir={root}/data", f"run_root_dir={root}/runs", *overrides],
    )


@dataclass
class TinySetup:
    cfg: Config
    data: Any  # TrainingData
    model: Any  # DiT4DiT (with its prompt cache set)
    cache: Any  # PromptCache
    policy_dir: Path


def dataset_instructions(data: Any) -> list[str]:
    found = getattr(data, "instructions", None)
    if found:
        return sorted(found)
    return sorted({t for ds in data.datasets for t in ds.meta.tasks.values()})


def build_tiny_setup(root: Path, *overrides: str, step: int = 0) -> TinySetup:
    """Demo data + a freshly built (untrained) tiny model, exported to ``root/policy``."""
    from dit4dit_npu.data import build_training_data
    from dit4dit_npu.policy import export_policy
    from dit4dit_npu.prompt_cache import PromptCache
    from dit4dit_npu.weights import build_dit4dit, build_prompt_encoder

    cfg = tiny_config(root, *overrides)
    data = build_training_data(cfg)
    model = build_dit4dit(cfg, data.io.spec)
    cache = PromptCache()
    cache.build(dataset_instructions(data), build_prompt_encoder(cfg))
    model.set_prompt_cache(cache)
    out = export_policy(
        root / "policy", model, cfg, data.io, cache, data.split, data.dataset_paths, step
    )
    return TinySetup(cfg, data, model, cache, out)


def observation_from_sample(camera_keys: list[str], sample: Any) -> dict[str, Any]:
    """A single observation as a robot sends it, from a ``RoboTwinDataset.raw_sample``."""
    obs: dict[str, Any] = {key: np.ascontiguousarray(sample.views[0, v]) for v, key in enumerate(camera_keys)}
    obs["state"] = sample.state.astype(np.float32)
    obs["instruction"] = sample.instruction
    return obs


_SHARED: dict[str, TinySetup] = {}


def shared_tiny_setup() -> TinySetup:
    """One tiny setup per test process (building it takes seconds): for tests that only read it."""
    if "setup" not in _SHARED:
        import atexit
        import shutil
        import tempfile

        root = Path(tempfile.mkdtemp(prefix="dit4dit_policy_"))
        atexit.register(shutil.rmtree, root, ignore_errors=True)
        _SHARED["setup"] = build_tiny_setup(root)
    return _SHARED["setup"]
