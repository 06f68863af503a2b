"""Multi-node start-up, with real processes and a real gloo process group standing in for two
nodes of one process each (RANK 0 and 1, LOCAL_RANK 0 on both):

- node-local storage, made real by starting each "node" in its own working directory with a
  relative ``run_root_dir``: every rank stops at start-up with the same one line;
- node-local tiny-model caches (one ``DIT4DIT_TINY_CACHE`` per node): each node's local rank 0
  writes its own complete cache (global rank 1 included, where transformers' save_pretrained
  writes no weights inside a process group).

Several ranks on one shared folder pass the same check in every 2-rank training test
(tests/test_train.py, tests/test_ema.py).
"""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs/robotwin/dit4dit_robotwin_tiny.yaml"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def two_nodes(command: list[str], cwd: list[Path], env: list[dict[str, str]] | None = None) -> list[subprocess.CompletedProcess]:
    """``command`` as rank 0 and rank 1 of a 2-node launch, one process per node."""
    port = str(free_port())
    procs = []
    for rank in (0, 1):
        e = {**os.environ, "DIT4DIT_DEVICE": "cpu", "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1",
             "MASTER_PORT": port, "WORLD_SIZE": "2", "RANK": str(rank), "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
             **((env or [{}, {}])[rank])}
        procs.append(subprocess.Popen(command, cwd=cwd[rank], env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=600)
        out.append(subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr))
    return out


@pytest.mark.slow  # two real node processes
def test_a_run_folder_the_nodes_do_not_share_stops_every_rank_in_one_line(tmp_path):
    nodes = [tmp_path / "node0", tmp_path / "node1"]
    for n in nodes:
        n.mkdir()
    runs = two_nodes([sys.executable, "-m", "dit4dit_npu.train", "--config", str(TINY), "run_root_dir=runs",
                      "run_id=shared", "trainer.deepspeed_config=null"], cwd=nodes)
    host = socket.gethostname()
    expected = (f"config error: run_root_dir/run_id: runs/shared is not one folder shared by all ranks: rank 1 ({host}) "
                f"does not see what rank 0 ({host}) wrote there; every node must see the same run folder (shared "
                "storage such as NFS or Lustre)")
    for rank, r in enumerate(runs):
        assert r.returncode == 2, (rank, r.stderr[-3000:])
        assert r.stderr.strip().splitlines()[-1] == expected, (rank, r.stderr[-3000:])
        assert "Traceback" not in r.stderr
    for n in nodes:  # a refused start leaves no run folder behind
        assert not (n / "runs" / "shared").exists()


@pytest.mark.slow  # two real node processes
def test_each_nodes_local_rank_0_writes_its_node_local_tiny_cache(tmp_path):
    script = (
        "import sys, torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "from dit4dit_npu.config import load_config\n"
        "from dit4dit_npu.weights import tiny_base_model\n"
        "print(tiny_base_model(load_config(sys.argv[1]).framework.cosmos25.tiny))\n"
        "dist.barrier()\n"
        "dist.destroy_process_group()\n"
    )
    caches = [tmp_path / "cache0", tmp_path / "cache1"]
    runs = two_nodes([sys.executable, "-c", script, str(TINY)], cwd=[tmp_path, tmp_path],
                     env=[{"DIT4DIT_TINY_CACHE": str(c)} for c in caches])
    folders = []
    for rank, r in enumerate(runs):
        assert r.returncode == 0, (rank, r.stderr[-3000:])
        folders.append(Path(r.stdout.strip().splitlines()[-1]))
        assert folders[-1].parent == caches[rank]
    weights = [sorted(f.rglob("*.safetensors")) for f in folders]
    assert [p.relative_to(folders[0]) for p in weights[0]] == [p.relative_to(folders[1]) for p in weights[1]]
    assert any(p.parent.name == "text_encoder" for p in weights[1])  # written by global rank 1 too
    digest = [[hashlib.sha256(p.read_bytes()).hexdigest() for p in w] for w in weights]
    assert digest[0] == digest[1]  # the same seeded tiny model on both nodes
