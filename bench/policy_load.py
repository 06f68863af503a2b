"""Loading a policy folder: time and memory of ``DiT4DiTPolicy.from_pretrained``, each load in a
fresh process.

    python bench/policy_load.py [--layers 4] [--work DIR]   # a transformer of the real width
    python bench/policy_load.py --smoke                      # tiny sizes, the joint policy, the headline's two loads

Two policies of the tiny config with the real transformer's width (16 heads x 128 = 2048; the
real model has 28 blocks, this one ``--layers``): one trained ``joint``, whose model.safetensors
holds the transformer, one ``training: action``, whose transformer is the base folder's (frozen).
Each is loaded three ways:
- ``fp32``: ``from_pretrained(policy)``; a joint policy's transformer comes from its own file;
- ``bf16``: ``from_pretrained(policy, backbone_dtype=torch.bfloat16)``;
- ``base read first``: the model built with the base folder's transformer, then the policy's
  weights copied over it (``build_dit4dit`` + ``load_trainable_state_dict``: how every load went
  before a policy that holds its transformer skipped the base folder's copy).

Memory: the peak of the process's anonymous resident memory (``RssAnon``, sampled every 2 ms: its
own allocations), and its peak RSS (``wait4``), which also counts the file pages a safetensors read
maps (the kernel can drop those; a weight that is only read stays such a page). The last line,
``speedup: X.XX``, is a MEMORY ratio: the joint policy's peak anonymous memory, base read first /
fp32.
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs/robotwin/dit4dit_robotwin_tiny.yaml"
WAYS = ("fp32", "bf16", "base read first")
GIB = 2**30


def sizes(a: argparse.Namespace) -> list[str]:
    if a.smoke:
        return []
    t = "framework.cosmos25.tiny"
    return [f"{t}.num_layers={a.layers}", f"{t}.num_attention_heads=16", f"{t}.attention_head_dim=128",
            f"{t}.text_embed_dim=1024", f"{t}.adaln_lora_dim=256"]


def export(work: Path, training: str, overrides: list[str]) -> Path:
    """A freshly built (untrained) policy of the tiny config at these sizes; written once, by a
    child process: a child's peak RSS counts its parent's at the fork (Linux keeps the high-water
    mark across exec), so this process must never hold a model."""
    out = work / f"policy_{training}"
    if not (out / "policy.json").is_file():
        subprocess.run([sys.executable, __file__, "--export", str(work), training, *overrides], check=True, cwd=ROOT)
    return out


def write_policy(work: Path, training: str, overrides: list[str]) -> None:
    from dit4dit_npu.config import load_config
    from dit4dit_npu.data import build_training_data
    from dit4dit_npu.data.demo import write_demo_dataset
    from dit4dit_npu.models.prompt_cache import PromptCache
    from dit4dit_npu.policy import export_policy
    from dit4dit_npu.weights import build_dit4dit, build_prompt_encoder

    data_root = work / "data"
    if not (data_root / "robotwin_demo").is_dir():
        write_demo_dataset(data_root / "robotwin_demo", num_episodes=4, episode_length=24)
    cfg = load_config(TINY, [f"framework.cosmos25.training={training}", f"datasets.vla_data.data_root_dir={data_root}",
                             f"run_root_dir={work}/runs", *overrides])
    data = build_training_data(cfg)
    model = build_dit4dit(cfg, data.io.spec)
    cache = PromptCache()
    cache.build(sorted({t for ds in data.datasets for t in ds.meta.tasks.values()}), build_prompt_encoder(cfg))
    model.set_prompt_cache(cache)
    export_policy(work / f"policy_{training}", model, cfg, data.io, cache, data.split, data.dataset_paths, 0)


def anon_gib() -> float:
    """This process's anonymous resident memory (its own allocations; not the file pages a
    safetensors read maps, which the kernel can drop and which ``ru_maxrss`` counts too)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024 / GIB
    return float("nan")


def child(policy: str, way: str) -> None:
    """One load, in this (fresh) process; prints its seconds and its peak anonymous memory (sampled
    every 2 ms by a thread)."""
    import threading

    import torch

    from dit4dit_npu.policy import DiT4DiTPolicy

    peak, done = [anon_gib()], threading.Event()

    def sample() -> None:
        while not done.wait(0.002):
            peak[0] = max(peak[0], anon_gib())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t0 = time.perf_counter()
    if way == "base read first":
        from dit4dit_npu.policy import folder
        from dit4dit_npu.policy.integrity import read_weights
        from dit4dit_npu.policy.manifest import inference_config
        from dit4dit_npu.weights import build_dit4dit

        path = folder.find_policy_dir(policy)
        io = folder.read_io(path)
        manifest = folder.read_manifest(path, folder.read_policy_json(path, False), io)
        weights, problem = read_weights(path / folder.WEIGHTS, manifest.step, path / folder.POLICY_JSON, "weights")
        assert problem is None, problem
        build_dit4dit(inference_config(manifest.model), io.spec).load_trainable_state_dict(weights)
    else:
        DiT4DiTPolicy.from_pretrained(policy, device="cpu", backbone_dtype=torch.bfloat16 if way == "bf16" else None)
    seconds = time.perf_counter() - t0
    done.set()
    sampler.join()
    print(f"{seconds:.2f} {max(peak[0], anon_gib()):.3f}")


def measure(policy: Path, way: str) -> tuple[float, float, float]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "DIT4DIT_DEVICE": "cpu"}
    proc = subprocess.Popen([sys.executable, __file__, "--child", str(policy), way], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    out = proc.stdout.read() if proc.stdout else ""
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"error: loading {policy} ({way}) failed; rerun it alone: {sys.executable} {__file__} --child {policy} '{way}'")
    seconds, anon = out.strip().splitlines()[-1].split()
    return float(seconds), float(anon), usage.ru_maxrss * 1024 / GIB


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=4, help="transformer blocks at the real width (the real model: 28)")
    p.add_argument("--work", type=Path, default=None,
                   help="the policies and their data, kept for the next run (default bench_policy_load/; --smoke: a "
                        "temporary folder, removed)")
    p.add_argument("--repeats", type=int, default=1, help="loads per way (the smallest peak and time kept)")
    p.add_argument("--smoke", action="store_true", help="the tiny config's own sizes: checks that the bench runs")
    p.add_argument("--child", nargs=2, metavar=("POLICY", "WAY"), help=argparse.SUPPRESS)
    p.add_argument("--export", nargs="+", metavar="WORK TRAINING OVERRIDE", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        child(*a.child)
        return
    if a.export:
        write_policy(Path(a.export[0]), a.export[1], a.export[2:])
        return
    if a.layers < 1 or a.repeats < 1:
        p.error("--layers and --repeats: expected >= 1")
    if a.work is None and a.smoke:
        with tempfile.TemporaryDirectory(prefix="policy_load_smoke_") as tmp:
            a.work = Path(tmp)
            return bench(a)
    a.work = a.work or ROOT / "bench_policy_load"
    a.work.mkdir(parents=True, exist_ok=True)
    return bench(a)


def bench(a: argparse.Namespace) -> None:
    # (the smoke: the joint policy alone, a third of the processes; the headline is its)
    policies = {t: export(a.work, t, sizes(a)) for t in (("joint",) if a.smoke else ("joint", "action"))}
    from safetensors import safe_open

    with safe_open(str(policies["joint"] / "model.safetensors"), framework="pt") as f:
        gb = sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys() if k.startswith("backbone.transformer.")) * 4 / GIB
    print(f"transformer: {gb:.2f} GiB of fp32 weights ({a.layers if not a.smoke else 'tiny'} blocks)")
    print(f"{'policy':<8} {'way':<16} {'load s':>7} {'peak anon GiB':>14} {'peak RSS GiB':>13}")
    peak: dict[tuple[str, str], float] = {}
    ways = ("fp32", "base read first") if a.smoke else WAYS  # (the smoke: the headline's two)
    for training, policy in policies.items():
        for way in ways:
            runs = [measure(policy, way) for _ in range(a.repeats)]
            s, peak[training, way], rss = (min(r[i] for r in runs) for i in range(3))
            print(f"{training:<8} {way:<16} {s:>7.2f} {peak[training, way]:>14.2f} {rss:>13.2f}")
    print(f"speedup: {peak['joint', 'base read first'] / peak['joint', 'fp32']:.2f}")


if __name__ == "__main__":
    main()
