"""What the serving benchmarks share (bench/serve_load.py, bench/serve_soak.py): the tiny policy
built in a temp folder, a real ``python -m dit4dit_npu.serve`` process, and a robot's random
observation from the server's metadata. A benchmark never imports another (tests/test_bench_imports.py)."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "configs" / "robotwin" / "dit4dit_robotwin_tiny.yaml"
WARMUP = 3  # requests per client before the timed burst (connections, allocator, caches)


def build_tiny_policy(root: Path) -> Path:
    """The tiny config's demo data (written under ``root``) + an untrained tiny model, exported as a
    policy folder."""
    from dit4dit_npu.config import load_config
    from dit4dit_npu.data import build_training_data
    from dit4dit_npu.data.demo import write_demo_dataset
    from dit4dit_npu.models.prompt_cache import PromptCache
    from dit4dit_npu.policy import export_policy
    from dit4dit_npu.weights import build_dit4dit, build_prompt_encoder

    write_demo_dataset(root / "data" / "robotwin_demo")
    cfg = load_config(TINY, [f"datasets.vla_data.data_root_dir={root}/data", f"run_root_dir={root}/runs",
                             "datasets.vla_data.generate_demo_if_missing=false"])
    data = build_training_data(cfg)
    model = build_dit4dit(cfg, data.io.spec)
    cache = PromptCache()
    cache.build(sorted({t for ds in data.datasets for t in ds.meta.tasks.values()}), build_prompt_encoder(cfg))
    return export_policy(root / "policy", model, cfg, data.io, cache, data.split, data.dataset_paths, 0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Served:
    uri: str  # ws://127.0.0.1:PORT
    pid: int  # the server process (bench/serve_soak.py reads its resident memory)


@contextlib.contextmanager
def server_process(
    checkpoint: Path, name: str, extra: list[str], threads: int, repo: Path = REPO
) -> Iterator[str]:
    """A real ``python -m dit4dit_npu.serve`` process of the checkout ``repo``; yields its ws://
    address once healthy."""
    with served(checkpoint, name, extra, threads, repo) as s:
        yield s.uri


@contextlib.contextmanager
def served(checkpoint: Path, name: str, extra: list[str], threads: int, repo: Path = REPO) -> Iterator[Served]:
    """``server_process``, yielding the process id too."""
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1"}
    log = open(Path(tempfile.gettempdir()) / f"serve_load_{name}_{port}.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(
        # a baseline checkout older than the flag's rename knows only --checkpoint
        [sys.executable, "-m", "dit4dit_npu.serve", "--policy" if repo == REPO else "--checkpoint", str(checkpoint),
         "--port", str(port),
         "--log-level", "WARNING", *extra],
        cwd=repo, env=env, stdout=log, stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"{name} server exited with {proc.returncode}; see {log.name}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit(f"{name} server not up after 300 s; see {log.name}") from None
                time.sleep(0.3)
        yield Served(f"ws://127.0.0.1:{port}", proc.pid)
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


def observation(meta: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    h, w = meta["image_size"]
    obs: dict[str, Any] = {k: rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for k in meta["camera_keys"]}
    stats = meta["policy_io"]["stats"]["state"]
    obs["state"] = rng.uniform(stats["min"], stats["max"]).astype(np.float32)
    obs["instruction"] = meta["instructions"][int(rng.integers(len(meta["instructions"])))]
    return obs


def policy_or_tiny(stack: contextlib.ExitStack, policy: Path | None, name: str) -> Path:
    """``policy``, or the tiny policy built in a temp folder that ``stack`` removes (its tiny-model
    cache there too, unless ``DIT4DIT_TINY_CACHE`` names one)."""
    if policy is not None:
        return policy
    root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=f"{name}_")))
    os.environ.setdefault("DIT4DIT_TINY_CACHE", str(root / "tiny_cache"))
    print("building the tiny policy ...", flush=True)
    return build_tiny_policy(root)
