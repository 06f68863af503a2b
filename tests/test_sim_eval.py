"""Closed-loop eval end to end: expert, hold, a policy folder, and a real websocket server
(``python -m dit4dit_npu.serve`` in a subprocess); bad input gets one line and exit code 2."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("gym_aloha", reason="simulation extra not installed (pip install -e '.[sim]')")

from dit4dit_npu.data.video import probe_video  # noqa: E402
from dit4dit_npu.sim.cli import eval_main  # noqa: E402
from dit4dit_npu.sim.errors import SimError  # noqa: E402
from dit4dit_npu.sim.policies import check_compatible  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def run_eval(capsys, *args: str) -> tuple[int, list[str], str]:
    code = eval_main(list(args))
    out = capsys.readouterr()
    return code, out.out.splitlines(), out.err


def results(path: Path) -> dict:
    return json.loads((path / "results.json").read_text())


@pytest.fixture(scope="module")
def policy_dir() -> Path:
    from policy_fixtures import shared_tiny_setup

    return shared_tiny_setup().policy_dir  # real tiny DiT4DiT, RoboTwin-shaped: 3 cameras, 14-d


@pytest.mark.slow
def test_expert_end_to_end_with_video(tmp_path: Path, capsys) -> None:
    out = tmp_path / "expert"
    code, lines, _ = run_eval(
        capsys,
        "--scripted",
        "expert",
        "--episodes",
        "1",
        "--seed",
        "3",
        "--size",
        "32x40",
        "--videos",
        "1",
        "--out",
        str(out),
    )
    assert code == 0
    assert lines[0].startswith("episode 1/1 seed 3: success at step ")
    assert "success 1/1 = 100.0% (95% Wilson CI 20.7–100.0%)" in lines
    r = results(out)
    ep = r["episodes"][0]
    assert ep["success"] and ep["success_within_300"] and ep["steps"] == ep["steps_to_success"] <= 300
    assert ep["env_ms_per_step"] > 0 and ep["policy_calls"] == ep["steps"]  # the expert replans every step
    assert r["summary"]["size_hw"] == [32, 40] and r["summary"]["successes"] == 1
    video = probe_video(ep["video"])
    assert (video["height"], video["width"], video["frames"]) == (32, 3 * 40, ep["steps"] + 1)


@pytest.mark.slow
def test_hold_in_parallel_workers_fails_every_seed(tmp_path: Path, capsys) -> None:
    out = tmp_path / "hold"
    code, lines, _ = run_eval(
        capsys,
        "--scripted",
        "hold",
        "--episodes",
        "3",
        "--max-steps",
        "15",
        "--size",
        "32x40",
        "--videos",
        "0",
        "--workers",
        "2",
        "--out",
        str(out),
    )
    assert code == 0
    assert sum(line.startswith("episode ") for line in lines) == 3
    assert "success 0/3 = 0.0% (95% Wilson CI 0.0–56.1%)" in lines
    r = results(out)
    assert [e["seed"] for e in r["episodes"]] == [0, 1, 2]
    assert all(e["steps"] == 15 and not e["success"] and e["max_reward"] == 0 for e in r["episodes"])
    assert r["summary"]["workers"] == 2 and not (out / "videos").exists()


@pytest.mark.slow
def test_policy_folder_chunks_and_replanning(tmp_path: Path, capsys, policy_dir: Path) -> None:
    out = tmp_path / "folder"
    code, lines, _ = run_eval(
        capsys,
        "--policy",
        str(policy_dir),
        "--episodes",
        "1",
        "--max-steps",
        "12",
        "--replan",
        "4",
        "--videos",
        "1",
        "--out",
        str(out),
    )
    assert code == 0, lines
    r = results(out)
    ep = r["episodes"][0]
    assert (ep["steps"], ep["policy_calls"]) == (12, 3)  # 3 queries x 4 executed actions
    assert ep["error"] is None and ep["policy_ms_per_call"] > 0
    assert r["summary"]["size_hw"] == [32, 32]  # the policy's training video size by default
    assert r["summary"]["chunk_length"] == 8


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_through_a_real_websocket_server(tmp_path: Path, capsys, policy_dir: Path) -> None:
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "dit4dit_npu.serve", "--policy", str(policy_dir), "--port", str(port)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out = tmp_path / "ws"
        code, lines, err = run_eval(
            capsys,
            "--server",
            f"ws://127.0.0.1:{port}",
            "--episodes",
            "2",
            "--max-steps",
            "8",
            "--videos",
            "0",
            "--connect-timeout",
            "120",
            "--out",
            str(out),
        )
        assert code == 0, err
        r = results(out)
        assert [(e["steps"], e["policy_calls"]) for e in r["episodes"]] == [
            (8, 1),
            (8, 1),
        ]  # whole 8-step chunks
        assert r["summary"]["policy_ms_per_chunk"] > 0
    finally:
        server.terminate()
        server.wait(30)


def test_mismatched_policies_are_refused(policy_dir: Path) -> None:
    from dit4dit_npu.policy import DiT4DiTPolicy

    meta = DiT4DiTPolicy.from_pretrained(policy_dir).metadata
    check_compatible("p", meta)  # the RoboTwin-shaped policy fits the ALOHA scene
    check_compatible("p", {**meta, "camera_keys": ["observation.images.cam_high"]})  # a subset is fine
    with pytest.raises(
        SimError, match=r"expects cameras \['observation.images.cam_front'\], but the ALOHA scene "
    ):
        check_compatible("p", {**meta, "camera_keys": ["observation.images.cam_front"]})
    with pytest.raises(SimError, match="has action_dim=7, but the ALOHA scene needs 14"):
        check_compatible("p", {**meta, "action_dim": 7})
    with pytest.raises(SimError, match="has state_dim=16"):
        check_compatible("p", {**meta, "state_dim": 16})


def test_bad_input_one_line_exit_2(tmp_path: Path, capsys, policy_dir: Path) -> None:
    out = tmp_path / "o"
    cases = [
        (["--scripted", "hold", "--task", "fold_shirt"], "error: unknown task 'fold_shirt'; expected one of"),
        (["--policy", str(tmp_path / "nope")], "is not a policy folder (a server: --server ws://HOST:PORT; a scripted"),
        (["--server", "localhost:8000"], "--server: expected ws://HOST:PORT, got 'localhost:8000'"),
        (["--scripted", "hold", "--execution", "rtc"], "--execution rtc: policy hold cannot inpaint onto a previous chunk"),
        (["--scripted", "expert", "--execution", "async"], "--execution: the async modes need a chunk policy"),
        (["--policy", str(policy_dir), "--execution", "rtc", "--replan", "4", "--delay-ms", "100"],
         "--replan 4 and the delay's 5 steps need chunks of max(replan, delay) + delay = 10 steps"),
        (["--scripted", "hold", "--delay-ms", "-5"], "--delay-ms: expected 0 to 60000, got -5"),
        (["--scripted", "hold", "--size", "31x40"], "--size: height and width must be even"),
        (["--scripted", "hold", "--episodes", "0"], "--episodes: expected >= 1, got 0"),
        (["--policy", str(policy_dir), "--replan", "9"], "--replan 9 exceeds the policy's chunk length 8"),
        (["--scripted", "hold", "--merge-lora"], "--merge-lora: applies to a policy folder, not hold"),
        (["--policy", str(policy_dir), "--merge-lora"], "this policy has no LoRA adapter to merge"),
        (["--server", f"ws://127.0.0.1:{free_port()}", "--connect-timeout", "0.5"], "server unreachable"),
        (["--server", f"ws://127.0.0.1:{free_port()}", "--connect-timeout", "-1"], "--connect-timeout: expected seconds > 0"),
        (["--scripted", "hold", "--connect-timeout", "nan"], "--connect-timeout: expected seconds > 0, got nan"),
        (["--scripted", "hold", "--workers", "2", "--episode-timeout", "0"], "--episode-timeout: expected seconds > 0, got 0"),
        (["--scripted", "hold", "--workers", "2", "--episode-timeout", "inf"], "--episode-timeout: expected seconds > 0"),
        (["--scripted", "hold", "--episode-timeout", "60"],
         "--episode-timeout 60: --workers 1 runs the episodes in this process, which waits on no worker"),
        (["--scripted", "hold", "--workers", "2", "--episodes", "1", "--episode-timeout", "60"],
         "--episode-timeout 60: --workers 2 with --episodes 1 runs in this process, which waits on no worker; it "
         "applies with --workers > 1 and --episodes > 1"),
        (["--scripted", "hold", "--noise-stream", "1"], "--noise-stream: applies to a policy folder (--policy DIR), not hold"),
        (["--server", "ws://127.0.0.1:9", "--noise-stream", "1"], "--noise-stream: applies to a policy folder"),
        (["--policy", str(policy_dir), "--noise-stream", "-1"], "--noise-stream -1: expected a seed in [0, 2**32)"),
        (["--policy", str(policy_dir), "--noise-stream", str(2**32)], "expected a seed in [0, 2**32)"),
        (["--policy", str(policy_dir), "--noise-stream", "1", "--workers", "2", "--episodes", "2"],
         "--noise-stream with --workers 2: one stream feeds the episodes in their order"),
    ]
    for args, message in cases:
        code, lines, err = run_eval(capsys, *args, "--out", str(out))
        assert code == 2, args
        assert len(err.strip().splitlines()) == 1 and message in err, err
        assert not out.exists()  # nothing written
    blocker = tmp_path / "a_file"  # --out that is a file, or under one: was NotADirectoryError / FileExistsError
    blocker.write_text("kept")
    for bad in (blocker, blocker / "sub"):
        code, _, err = run_eval(capsys, "--scripted", "hold", "--episodes", "1", "--max-steps", "2", "--out", str(bad))
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert f"--out {bad}: {blocker} is a file, not a folder" in err and blocker.read_text() == "kept"
    out.mkdir()
    (out / "results.json").write_text("{}")
    code, _, err = run_eval(capsys, "--scripted", "hold", "--out", str(out))
    assert code == 2 and "exists; choose another folder" in err and (out / "results.json").read_text() == "{}"


def test_a_folder_without_a_policy_is_refused_before_any_worker_starts(tmp_path: Path, capsys) -> None:
    """Each worker would refuse it too, with the same line, after importing torch and the model
    library (~10 s a process here, 38 s for two on a busy host): the refusal must come first."""
    empty = tmp_path / "empty_policy"
    empty.mkdir()
    t0 = time.monotonic()
    code, _, err = run_eval(capsys, "--policy", str(empty), "--workers", "2", "--episodes", "2", "--out", str(tmp_path / "o"))
    assert code == 2 and err.strip() == (f"error: --policy {empty}: {empty} is not a policy folder: no policy.json in "
                                         f"it, in {empty / 'policy'} or under {empty / 'checkpoints'} (an exported policy "
                                         "has policy.json, model.safetensors, policy_io.json, prompt_cache.safetensors)"), err
    assert time.monotonic() - t0 < 5, "the workers were started before the folder was checked"
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("gl", ["bogus", "glfw"])
def test_renderer_that_cannot_start_names_the_mujoco_gl_choices(tmp_path: Path, gl: str) -> None:
    env = {**os.environ, "MUJOCO_GL": gl, "DISPLAY": ""}
    proc = subprocess.run(
        [sys.executable, "-m", "dit4dit_npu.sim.eval", "--scripted", "hold", "--out", str(tmp_path / "o")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith("error: ") and f"MUJOCO_GL={gl}" in lines[-1]
    assert "MUJOCO_GL=egl" in lines[-1] and "MUJOCO_GL=osmesa" in lines[-1]
    assert not (tmp_path / "o").exists()


def test_policy_observation_is_exactly_what_predict_action_takes(policy_dir: Path) -> None:
    from dit4dit_npu.policy import DiT4DiTPolicy
    from dit4dit_npu.sim.scene import AlohaScene

    policy = DiT4DiTPolicy.from_pretrained(policy_dir)
    with AlohaScene("transfer_cube", (32, 32)) as scene:
        obs = scene.reset(0)
    chunk = policy.predict_action(obs, seed=0)  # the scene's observation, unmodified
    assert chunk.shape == (8, 14) and np.isfinite(chunk).all()


def test_noise_stream_draws_as_lerobot_eval_does_and_the_default_seeds_each_chunk(policy_dir: Path) -> None:
    """``--noise-stream S`` is lerobot-eval's protocol: the global RNGs seeded with S before the
    policy is built, then every chunk an unseeded draw from torch's stream (so two chunks of the
    same observation differ). The default seeds chunk j of episode s with s * 10000 + j."""
    import torch

    from dit4dit_npu.policy import DiT4DiTPolicy
    from dit4dit_npu.sim.rollout import EvalSetup, Worker

    def setup(stream: int | None) -> EvalSetup:
        return EvalSetup(task="transfer_cube", policy=str(policy_dir), max_steps=16, replan=None, size_hw=None,
                         noise_stream=stream)

    worker = Worker(setup(7))
    try:
        obs = worker.scene.reset(0)
        worker.policy.reset(worker.scene, 0)
        ours = [worker.policy.act(obs) for _ in range(2)]
    finally:
        worker.close()
    torch.manual_seed(7)  # lerobot's set_seed (torch's part), then the policy built, then unseeded calls
    policy = DiT4DiTPolicy.from_pretrained(policy_dir)
    theirs = [policy.predict_action(obs) for _ in range(2)]
    assert all(np.array_equal(a, b) for a, b in zip(ours, theirs))
    assert not np.array_equal(ours[0], ours[1])  # one stream, not reseeded per chunk

    worker = Worker(setup(None))
    try:
        worker.policy.reset(worker.scene, 3)
        seeded = [worker.policy.act(obs) for _ in range(2)]
    finally:
        worker.close()
    assert all(np.array_equal(a, policy.predict_action(obs, seed=30_000 + j)) for j, a in zip((1, 2), seeded))


def test_a_policy_folder_refuses_a_stream_seed_lerobot_cannot_take_before_seeding_anything(policy_dir: Path) -> None:
    """``FolderPolicy(noise_stream=...)`` as a library (the replay script builds it so): a seed outside
    numpy's range is one line, and no RNG of the process was seeded (lerobot's ``set_seed`` refuses it too)."""
    import random

    import torch

    from dit4dit_npu.sim.policies import FolderPolicy

    for seed in (-1, 2**32):
        before = (random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state())
        with pytest.raises(SimError, match=rf"^--noise-stream {seed}: expected a seed in \[0, 2\*\*32\)"):
            FolderPolicy(str(policy_dir), noise_stream=seed)
        assert random.getstate() == before[0] and np.array_equal(np.random.get_state()[1], before[1])
        assert torch.equal(torch.get_rng_state(), before[2])


class _ChunkOf:
    """A stand-in policy that returns a fixed chunk: the harness's own guard is what is tested."""

    name, metadata, takes_prefix = "fixed", {}, False

    def __init__(self, chunk: np.ndarray) -> None:
        self.chunk = chunk

    def reset(self, scene, seed: int) -> None:
        pass

    def act(self, obs, request=None) -> np.ndarray:
        return self.chunk

    def close(self) -> None:
        pass


def test_non_finite_actions_never_reach_the_scene_and_bad_shapes_stop_the_eval() -> None:
    from dit4dit_npu.sim.rollout import run_episode
    from dit4dit_npu.sim.scene import AlohaScene

    with AlohaScene("transfer_cube", render=False) as scene:
        start = scene.reset(0)["state"]
        chunk = np.stack([start, start, np.full(14, np.inf, np.float32)])
        r = run_episode(scene, _ChunkOf(chunk), seed=0, max_steps=50, replan=None)
        # refused whole when it arrives: not even its finite actions run
        assert r["steps"] == 0 and not r["success"] and "non-finite actions from the policy at step 0" in r["error"]
        with pytest.raises(SimError, match=r"returned actions of shape \(4, 7\), expected \(k, 14\)"):
            run_episode(scene, _ChunkOf(np.zeros((4, 7), np.float32)), seed=0, max_steps=5, replan=None)


def test_default_render_size_follows_the_policy_training_videos() -> None:
    from dit4dit_npu.sim.rollout import DEFAULT_SIZE, default_size

    cams = ["observation.images.cam_high"]
    assert default_size({"camera_keys": cams, "source_image_sizes": {cams[0]: [[96, 128]]}}) == (96, 128)
    assert (
        default_size({"camera_keys": cams, "source_image_sizes": {cams[0]: [[96, 128], [240, 320]]}})
        == DEFAULT_SIZE
    )
    assert default_size({}) == DEFAULT_SIZE == (240, 320)


def test_former_policy_spellings_for_servers_and_scripted_policies_say_so_once(tmp_path: Path, capsys) -> None:
    """``--policy hold`` / ``--policy ws://...`` (before --scripted and --server) keep working: the
    same policy, one notice line naming the new flag."""
    from dit4dit_npu.sim.cli import acting_flags
    from dit4dit_npu.sim.cli import parse_eval_args as parse_args

    out = tmp_path / "o"
    for old, new in (["hold", ["--scripted", "hold"]], ["ws://127.0.0.1:9", ["--server", "ws://127.0.0.1:9"]]):
        assert acting_flags(old) == new
        assert parse_args(["--policy", old, "--out", str(out)]).policy == old
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"notice: --policy {old} is deprecated, use {' '.join(new)}"]
        assert parse_args([*new, "--out", str(out)]).policy == old
        assert capsys.readouterr().err == ""
    assert acting_flags(str(tmp_path)) == ["--policy", str(tmp_path)]
    code, _, err = run_eval(capsys, "--policy", "hold", "--episodes", "0", "--out", str(out))
    assert code == 2 and err.splitlines() == ["notice: --policy hold is deprecated, use --scripted hold",
                                              "error: --episodes: expected >= 1, got 0"]
    with pytest.raises(SystemExit):  # argparse: not both
        parse_args(["--policy", str(tmp_path), "--scripted", "hold", "--out", str(out)])
