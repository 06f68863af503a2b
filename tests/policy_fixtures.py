"""Builders shared by the policy / serve / eval tests: a tiny model on the generated demo
dataset, exported with the real ``export_policy`` (no mocks anywhere)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dit4dit_npu.config import Config, load_config

TINY_YAML = Path(__file__).resolve().parents[1] / "configs" / "robotwin" / "dit4dit_robotwin_tiny.yaml"


def tiny_config(root: Path, *overrides: str, data_root: Path | None = None, yaml: Path = TINY_YAML) -> Config:
    """The embedded tiny config (or another ``yaml``) with runs under ``root`` and its data under
    ``data_root`` (default: the demo data, written to ``root/data`` here, since the trainer generates
    it only at its default location)."""
    from dit4dit_npu.data.demo import write_demo_dataset

    if data_root is None:
        data_root = root / "data"
        if not (data_root / "robotwin_demo").exists():
            write_demo_dataset(data_root / "robotwin_demo")
    return load_config(
        yaml,
        [f"datasets.vla_data.data_root_dir={data_root}", f"run_root_dir={root}/runs", *overrides],
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


def build_tiny_setup(
    root: Path, *overrides: str, step: int = 0, data_root: Path | None = None, yaml: Path = TINY_YAML
) -> TinySetup:
    """Demo data (or ``yaml``'s data under ``data_root``) + a freshly built (untrained) tiny model,
    exported to ``root/policy``."""
    from dit4dit_npu.data import build_training_data
    from dit4dit_npu.models.prompt_cache import PromptCache
    from dit4dit_npu.policy import export_policy
    from dit4dit_npu.weights import build_dit4dit, build_prompt_encoder

    cfg = tiny_config(root, *overrides, data_root=data_root, yaml=yaml)
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


_SHARED: dict[str, Any] = {}


def _process_temp_dir(prefix: str) -> Path:
    import atexit
    import shutil
    import tempfile

    root = Path(tempfile.mkdtemp(prefix=prefix))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    return root


def shared_demo_root() -> Path:
    """The tiny config's demo dataset (``robotwin_demo`` under the returned folder), written once
    per test process: every test that only reads demo data shares it (training tests included)."""
    if "data" not in _SHARED:
        from dit4dit_npu.data.demo import write_demo_dataset

        root = _process_temp_dir("dit4dit_demo_")
        write_demo_dataset(root / "robotwin_demo")
        _SHARED["data"] = root
    return _SHARED["data"]


def shared_tiny_setup() -> TinySetup:
    """One tiny setup per test process (building it takes seconds): for tests that only read it."""
    if "setup" not in _SHARED:
        _SHARED["setup"] = build_tiny_setup(_process_temp_dir("dit4dit_policy_"), data_root=shared_demo_root())
    return _SHARED["setup"]


def reseal(folder: Path) -> None:
    """Record the files of a policy folder a test edited in its policy.json again, as the export
    does, so the test reaches the check behind the content hashes (what a folder of a format
    without hashes meets, or files a consistent but wrong writer produced)."""
    import json

    from dit4dit_npu.files import SELF_HASH
    from dit4dit_npu.policy.folder import write_policy_json
    from dit4dit_npu.policy.manifest import CONTENT

    raw = json.loads((folder / "policy.json").read_text())
    write_policy_json(folder, {k: v for k, v in raw.items() if k not in (CONTENT, SELF_HASH)})
