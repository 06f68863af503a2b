"""The stack in closed loop, small: two expert demos -> a few training steps with
``trainer.sim_eval`` on -> one episode through the policy folder and one through the server.

The trainer runs in this process (``train_runs.train_cli_here``); its closed-loop eval and the
websocket server are real processes of their own, the demos and the scene real MuJoCo; the full
recipe is a benchmark (``scripts/aloha_recipe.sh``), not a test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("gym_aloha", reason="simulation extra not installed (pip install -e '.[sim]')")

from train_runs import train_cli_here  # noqa: E402

from dit4dit_npu.sim.demos import write_demos  # noqa: E402
from dit4dit_npu.train.metrics import read_metrics  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs/aloha/dit4dit_aloha_transfer_cube_tiny.yaml"
ENV = {**os.environ, "DIT4DIT_DEVICE": "cpu", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"}
SIZE = (32, 48)  # the smallest views the backbone takes for three cameras side by side (3 x 48 = 144 = 9 x 16)
EPISODE_STEPS = 16  # one whole chunk: a closed-loop episode here checks the path, not the skill


@pytest.fixture(scope="module")
def demos(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("aloha")
    write_demos(root / "tc2", "transfer_cube", 2, SIZE, progress=False)
    return root


@pytest.fixture(scope="module")
def no_demos(tmp_path_factory) -> Path:
    """An empty data folder: the sim_eval settings are checked before any data is read (two real
    demos cost ~20 s of simulation, which the fast tier's checks of those settings do not need)."""
    return tmp_path_factory.mktemp("no_demos")


def overrides(run_root: Path, demos: Path, **extra) -> list[str]:
    base = {
        "run_root_dir": str(run_root),
        "datasets.vla_data.data_root_dir": str(demos),
        "datasets.vla_data.data_mix": "[{path: tc2, weight: 1.0}]",
        "datasets.vla_data.image_size": f"[{SIZE[0]}, {SIZE[1]}]",
        "datasets.vla_data.val_fraction": "0.5",  # one demo trains, one is held out
        "datasets.vla_data.per_device_batch_size": "2",
        "trainer.deepspeed_config": "null",
        "trainer.max_train_steps": "2",
        "trainer.save_interval": "2",
        "trainer.eval_interval": "2",
        "trainer.eval_samples": "2",
        "trainer.logging_frequency": "1",
        "trainer.num_warmup_steps": "0",
        "trainer.sim_eval.task": "transfer_cube",
        "trainer.sim_eval.episodes": "1",
        "trainer.sim_eval.interval": "2",
        "trainer.sim_eval.max_steps": str(EPISODE_STEPS),
    }
    base.update({k: str(v) for k, v in extra.items()})
    return [f"{k}={v}" for k, v in base.items()]


def train(args: list[str], env: dict | None = None, entry: tuple[str, ...] = ("-m", "dit4dit_npu.train")):
    return subprocess.run(
        [sys.executable, *entry, "--config", str(CONFIG), *args],
        env=env or ENV, capture_output=True, text=True, cwd=ROOT, timeout=600,
    )


def sim_eval(capsys, policy: str, out: Path, *extra: str) -> dict:
    """One closed-loop episode through ``dit4dit_npu.sim.eval`` (in this process: the policy side
    is what is tested; the scene is the real one either way)."""
    from dit4dit_npu.sim.cli import eval_main

    code = eval_main(["--policy", policy, "--episodes", "1", "--max-steps", str(EPISODE_STEPS), "--videos", "0",
                      "--out", str(out), *extra])
    lines = capsys.readouterr().out.splitlines()
    assert code == 0 and lines[-3].startswith("success "), lines
    return json.loads((out / "results.json").read_text())


@pytest.fixture(scope="module")
def run_dir(demos, tmp_path_factory) -> Path:
    runs = tmp_path_factory.mktemp("runs")
    assert train_cli_here(["--config", str(CONFIG), *overrides(runs, demos)]).returncode == 0
    return runs / "dit4dit_aloha_transfer_cube_tiny"


@pytest.mark.slow  # a training run that starts the simulator's eval process
def test_trainer_logs_closed_loop_success_next_to_the_held_out_error(run_dir: Path) -> None:
    rows = [m for m in read_metrics(run_dir / "metrics.jsonl") if "sim/success_rate" in m]
    assert len(rows) == 1 and rows[0]["step"] == 2
    assert 0.0 <= rows[0]["sim/success_rate"] <= 1.0 and 0.0 <= rows[0]["sim/mean_max_reward"] <= 4.0
    assert any("val/action_mse" in m and m["step"] == 2 for m in read_metrics(run_dir / "metrics.jsonl"))
    folder = run_dir / "sim_eval" / "step_000002"
    episodes = json.loads((folder / "results.json").read_text())["episodes"]
    assert [(e["seed"], e["steps"]) for e in episodes] == [(0, EPISODE_STEPS)]
    assert (folder / "eval.log").is_file() and not (folder / "policy").exists()  # the weights are not kept


@pytest.mark.slow
def test_trained_policy_runs_closed_loop_from_its_folder_and_through_the_server(
    run_dir: Path, tmp_path: Path, capsys
) -> None:
    import socket

    policy = run_dir / "checkpoints" / "step_000002" / "policy"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # The server starts first and loads while the folder episode runs here (the test's two costs overlap).
    server = subprocess.Popen(
        [sys.executable, "-m", "dit4dit_npu.serve", "--policy", str(policy), "--port", str(port)],
        cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        r = sim_eval(capsys, str(policy), tmp_path / "folder")
        assert r["summary"]["size_hw"] == list(SIZE) and r["episodes"][0]["error"] is None
        ran_whole_chunk(r["episodes"][0])
        r = sim_eval(capsys, f"ws://127.0.0.1:{port}", tmp_path / "server", "--connect-timeout", "120")
    finally:
        server.terminate()
        server.wait(30)
    ran_whole_chunk(r["episodes"][0])


@pytest.mark.slow
def test_feature_probe_reads_the_policys_own_features(run_dir: Path, tmp_path: Path, capsys) -> None:
    """The probe's features are what predict_action's head reads (same seed, same chunk), and
    its CLI scores every feature set on held-out seeds."""
    import numpy as np
    import torch

    from dit4dit_npu.eval.cli import feature_probe_main as probe_main
    from dit4dit_npu.eval.feature_probe import collect
    from dit4dit_npu.eval.research import observation_features
    from dit4dit_npu.policy import DiT4DiTPolicy

    policy_dir = run_dir / "checkpoints" / "step_000002" / "policy"
    observations, targets = collect("transfer_cube", [0, 1], [0, 3], SIZE)
    assert len(observations) == 4 and targets.shape == (4, 2)
    assert not np.allclose(targets[0], targets[2])  # two seeds, two cube places
    policy = DiT4DiTPolicy.from_pretrained(policy_dir, device="cpu")
    out = observation_features(policy, observations[1], seed=3)
    feats = torch.from_numpy(out["features"])
    assert out["latent"].shape[:3] == (1, 16, 1) and feats.ndim == 3
    batch = policy.io.encode_parsed(policy.io.parse_observation(observations[1]))
    with torch.no_grad():
        chunk = policy.model.action_model.sample(feats, batch.state, torch.Generator().manual_seed(3))
        direct = policy.model.predict_action(batch, seed=3)
    torch.testing.assert_close(chunk, direct, rtol=0, atol=0)

    assert probe_main(["--policy", str(policy_dir), "--episodes", "10", "--size", f"{SIZE[0]}x{SIZE[1]}",
                       "--out", str(tmp_path / "probe.json")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1].startswith("probe R^2: features "), lines
    row = json.loads((tmp_path / "probe.json").read_text())["rows"][0]
    assert set(row) == {"policy", "state (control)", "VAE latent", "features", "features, token mean"}
    assert all(np.isfinite(v) for k, v in row.items() if k != "policy")


@pytest.mark.slow
def test_video_picture_shows_real_round_trip_and_imagined_clips(run_dir: Path, tmp_path: Path, demos, capsys) -> None:
    """The picture's PNG is written, its rows are the policy's clips as the model tiles them, and
    the round trip of a clip is the VAE's own encode -> decode of the same views."""
    import numpy as np
    import torch

    from dit4dit_npu.eval.cli import video_picture_main as picture_main
    from dit4dit_npu.eval.offline import build_eval_dataset
    from dit4dit_npu.eval.research import reconstruct_video
    from dit4dit_npu.eval.video_picture import closed_loop_strips, demo_strips
    from dit4dit_npu.models.dit4dit import video_input
    from dit4dit_npu.models.pixels import to_uint8

    policy_dir = run_dir / "checkpoints" / "step_000002" / "policy"
    out = tmp_path / "docs" / "picture.png"
    assert picture_main(["--policy", str(policy_dir), "--demos", str(demos / "tc2"), "--at", "0", "8",
                         "--out", str(out)]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith(f"wrote {out}: steps [0, 8]")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 1000

    policy, loop, result = closed_loop_strips(str(policy_dir), "transfer_cube", 0, [0, 8], 2)
    strips = demo_strips(policy, demos / "tc2", 1, [0, 8], 2, 0) + loop
    h, w = policy.io.frame_size
    t = len(policy.io.clip_offsets)  # this tiny policy trains on one-frame clips
    assert [title for title, _ in strips] == ["demo tc2 ep1 t=0", "demo tc2 ep1 t=8",
                                              "closed loop seed 0 t=0", "closed loop seed 0 t=8"]
    assert result["steps"] == 8 or result["success"]
    for _, rows in strips:
        assert [label for label, _ in rows] == ["real", "round trip", "imagined"]
        assert all(clip.shape == (t, h, w, 3) and clip.dtype == np.uint8 for _, clip in rows)
    assert not np.array_equal(strips[0][1][0][1], strips[1][1][0][1])  # two steps, two frames

    # a 5-frame clip (the joint objective's offsets) through the policy and through the VAE itself
    ds = build_eval_dataset(policy, [(demos / "tc2", [1])])
    views = np.concatenate([ds.raw_sample(i).views for i in (0, 4, 8, 12, 16)])
    round_trip = reconstruct_video(policy, views)
    assert round_trip.shape == (5, h, w, 3)
    vae = policy.model.backbone.vae
    with torch.no_grad():
        z = vae.encode(video_input(policy.io.frames(views)[None]).float()).latent_dist.mode()
        own = to_uint8(vae.decode(z).sample)[0].permute(1, 2, 3, 0).numpy()
    assert np.abs(round_trip.astype(int) - own.astype(int)).max() <= 1
    assert not np.array_equal(round_trip[0], round_trip[4])


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--at", "-1"], "--at: expected steps >= 0, got [-1]"),
        (["--steps", "0"], "--steps: expected >= 1, got 0"),
        (["--out", "picture.jpg"], "picture.jpg: expected a .png file"),
        ([], "no such folder"),  # --policy
    ],
)
def test_bad_video_picture_flags_are_one_line_before_anything_is_written(tmp_path, capsys, args, expected) -> None:
    from dit4dit_npu.eval.cli import video_picture_main as picture_main

    out = tmp_path / "picture.png"
    flags = {"--policy": str(tmp_path / "missing"), "--demos": str(tmp_path), "--out": str(out)}
    flags.update(zip(args[::2], args[1::2]))
    assert picture_main([x for kv in flags.items() for x in kv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expected in err[0], err
    assert not any(tmp_path.iterdir())


def ran_whole_chunk(episode: dict) -> None:
    """One chunk, executed to the episode's end, or to a success: a 2-step policy's wild arm can
    fling the cube against the left gripper in mid-air, which gym-aloha's contact reward scores 4
    (seen about 1 in 12 server episodes, whose flow-matching noise is not seeded)."""
    assert episode["error"] is None and episode["policy_calls"] == 1, episode
    assert episode["steps"] == EPISODE_STEPS or (episode["success"] and episode["max_reward"] == 4.0), episode


@pytest.mark.parametrize(
    "key, value, expected",
    [
        ("trainer.sim_eval.task", "transfer_cub", "trainer.sim_eval.task: got 'transfer_cub', expected one of ['insertion', 'transfer_cube']"),
        ("trainer.sim_eval.episodes", "0", "trainer.sim_eval.episodes: got 0, expected >= 1"),
        ("trainer.sim_eval.size", "[33, 48]", "trainer.sim_eval.size: got [33, 48]"),
    ],
)
def test_bad_sim_eval_settings_are_one_line_before_anything_is_written(tmp_path, no_demos, capsys, key, value, expected):
    from dit4dit_npu.train.cli import main as train_main

    assert train_main(["--config", str(CONFIG), *overrides(tmp_path, no_demos, **{key: value})]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expected in err[0], err
    assert not any(tmp_path.iterdir())


BLOCK_SIM_EXTRA = """
import sys
sys.modules["gym_aloha"] = None  # what an environment without the sim extra looks like to importlib
from dit4dit_npu.train.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_sim_eval_without_the_sim_extra_is_refused_in_one_line(tmp_path, no_demos, monkeypatch) -> None:
    r = train(overrides(tmp_path, no_demos), entry=("-c", BLOCK_SIM_EXTRA))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert r.stderr.strip().splitlines()[-1] == (
        "config error: trainer.sim_eval: the simulation extra is not installed (gym_aloha missing): "
        "pip install -e '.[sim]', or set trainer.sim_eval.task=null"
    )
    assert not any(tmp_path.iterdir())
    from dit4dit_npu.config import SimEvalConfig
    from dit4dit_npu.sim.training_eval import check_sim_eval

    monkeypatch.setitem(sys.modules, "gym_aloha", None)
    check_sim_eval(SimEvalConfig(task=None))  # off: nothing is needed


@pytest.mark.slow  # a training run that starts the simulator's eval process
def test_an_eval_that_cannot_start_is_one_line(tmp_path, run_dir, monkeypatch) -> None:
    from dit4dit_npu.config import SimEvalConfig
    from dit4dit_npu.sim.training_eval import SimEvalFailed, evaluate

    monkeypatch.setenv("MUJOCO_GL", "no_such_platform")  # the eval child cannot load OpenGL
    cfg = SimEvalConfig(task="transfer_cube", episodes=1, max_steps=EPISODE_STEPS)
    with pytest.raises(SimEvalFailed, match=r"exit code 2: error: MuJoCo cannot load OpenGL with MUJOCO_GL=no_such_platform"):
        evaluate(run_dir / "checkpoints" / "step_000002" / "policy", cfg, tmp_path / "eval")
    assert (tmp_path / "eval" / "eval.log").is_file() and not (tmp_path / "eval" / "results.json").exists()


@pytest.mark.slow
def test_a_simulator_that_cannot_start_costs_a_warning_not_the_run(tmp_path, demos, monkeypatch, capfd) -> None:
    monkeypatch.setenv("MUJOCO_GL", "no_such_platform")  # the trainer's eval child cannot load OpenGL
    args = overrides(tmp_path, demos, **{"trainer.max_train_steps": 1, "trainer.save_interval": 1,
                                         "trainer.sim_eval.interval": 1})
    r = train_cli_here(["--config", str(CONFIG), *args], capfd)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    warning = [line for line in (r.stdout + r.stderr).splitlines() if "sim eval at step 1 failed" in line]
    assert len(warning) == 1 and "MUJOCO_GL" in warning[0] and "training goes on" in warning[0]
    run = tmp_path / "dit4dit_aloha_transfer_cube_tiny"
    assert (run / "checkpoints" / "step_000001" / "policy").is_dir()
    assert not any("sim/success_rate" in m for m in read_metrics(run / "metrics.jsonl"))
