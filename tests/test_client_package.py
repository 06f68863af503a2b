"""The robot-side client package (client/) installs alone into a fresh virtualenv without torch and
talks to a real server from there: both observation layouts, a real-time-chunking session, and
DiT4DiT's own protocol. Offline: the venv sees the base interpreter's numpy (no torch), msgpack
and websockets come from this environment through a .pth naming only those two, and the client
is the wheel pip builds from a copy of client/, installed with --no-index --no-deps."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: tomli, which pytest itself requires there
    import tomli as tomllib
from serve_fixtures import RunningServer, dit4dit_example, load_policy, sample_observations

REPO = Path(__file__).resolve().parents[1]

SCRIPT = r"""
import json, sys
import numpy as np
import dit4dit_client
from dit4dit_client import Dit4DitClient, WebsocketClientPolicy

assert "torch" not in sys.modules
try:
    import torch  # noqa: F401
    torch_importable = True
except ModuleNotFoundError:
    torch_importable = False
uri, inputs, out = sys.argv[1:4]
data = dict(np.load(inputs))
obs = {k[4:]: data[k] for k in data if k.startswith("obs.")}
obs["instruction"] = str(data["instruction"])
with WebsocketClientPolicy(uri, None, connect_timeout_s=30) as client:
    meta = client.get_server_metadata()
    first = client.infer({**obs, "seed": 1})
    rtc = client.infer({**obs, "seed": 2}, rtc={"executed": 3, "inference_delay": 2})
    openpi = {"images": {k.split(".")[-1]: obs[k] for k in meta["camera_keys"]}, "state": obs["state"],
              "prompt": obs["instruction"], "seed": 1}
    openpi_out = client.infer(openpi)
with Dit4DitClient(uri, None, connect_timeout_s=30) as d4d:
    assert d4d.ping()
    ex = {"image": [data["example.image"]], "state": data["example.state"], "lang": obs["instruction"]}
    normalized = d4d.predict([ex], seed=1)
np.savez(out, first=first["actions"], rtc=rtc["actions"], openpi=openpi_out["actions"], normalized=normalized)
print(json.dumps({"torch_importable": torch_importable, "torch_loaded": "torch" in sys.modules,
                  "client_file": dit4dit_client.__file__, "rtc": rtc["rtc"]}))
"""


def test_client_declares_only_numpy_msgpack_websockets() -> None:
    meta = tomllib.loads((REPO / "client" / "pyproject.toml").read_text())
    names = {d.split(">")[0].split("=")[0].split("<")[0].strip() for d in meta["project"]["dependencies"]}
    assert names == {"numpy", "msgpack", "websockets"}


def test_importing_the_client_never_imports_torch() -> None:
    code = "import sys, dit4dit_client, dit4dit_client.runtime, dit4dit_client.chunking; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.slow
def test_client_installs_into_a_fresh_venv_without_torch_and_serves(tmp_path: Path) -> None:
    base = Path(getattr(sys, "_base_executable", sys.executable))
    probe = subprocess.run([str(base), "-c", "import numpy, importlib.util as u; print(u.find_spec('torch') is None)"],
                           capture_output=True, text=True)
    if probe.returncode or probe.stdout.strip() != "True":
        pytest.skip(f"the base interpreter {base} needs numpy and no torch for this test")
    venv = tmp_path / "venv"
    subprocess.run([str(base), "-m", "venv", "--system-site-packages", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    # msgpack and websockets from this environment, and nothing else of it (not torch)
    ours = Path(sysconfig.get_paths()["purelib"])
    shim = tmp_path / "wire_deps"
    shim.mkdir()
    for pkg in ("msgpack", "websockets"):
        (shim / pkg).symlink_to(ours / pkg, target_is_directory=True)
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    (Path(site) / "wire_deps.pth").write_text(f"{shim}\n")
    # the wheel pip builds from client/ (here, offline), installed alone into the fresh venv
    src, wheels = tmp_path / "client", tmp_path / "wheels"
    shutil.copytree(REPO / "client", src, ignore=shutil.ignore_patterns("*.egg-info", "build", "__pycache__"))
    pip = ["-m", "pip", "--disable-pip-version-check", "--quiet"]
    subprocess.run([sys.executable, *pip, "wheel", "--no-index", "--no-deps", "--no-build-isolation", "-w", str(wheels),
                    str(src)], check=True, timeout=300)
    (wheel,) = wheels.glob("dit4dit_client-*.whl")
    subprocess.run([str(py), *pip, "install", "--no-index", "--no-deps", str(wheel)], check=True, timeout=300)

    policy = load_policy()
    obs = sample_observations(policy, 1)[0]
    io = policy.io
    stats = io.stats["state"]
    example = dit4dit_example(obs, policy.camera_keys, stats.min, stats.max)
    inputs = tmp_path / "inputs.npz"
    np.savez(inputs, instruction=obs["instruction"], **{f"obs.{k}": v for k, v in obs.items() if k != "instruction"},
             **{"example.image": example["image"][0], "example.state": example["state"]})
    out = tmp_path / "out.npz"
    script = tmp_path / "robot.py"
    script.write_text(SCRIPT)
    with RunningServer(policy) as server:
        run = subprocess.run([str(py), str(script), server.uri, str(inputs), str(out)],
                             capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert report == {**report, "torch_importable": False, "torch_loaded": False}
    assert report["client_file"].startswith(str(venv))  # the installed copy, not this checkout's
    got = np.load(out)
    first = policy.predict_action(obs, seed=1)
    np.testing.assert_array_equal(got["first"], first)
    np.testing.assert_array_equal(got["openpi"], first)
    np.testing.assert_array_equal(
        got["rtc"], policy.predict_action(obs, seed=2, prev_chunk=first[3:], inference_delay=2, own_chunk=True)
    )
    assert got["normalized"].shape == (1, policy.chunk_length, io.spec.action_width)
