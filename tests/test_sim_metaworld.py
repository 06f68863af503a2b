"""Meta-World in the project's own closed-loop eval (``--task metaworld/<task>``): the refusals
(one line, exit code 2, nothing written), the observation against lerobot's way of making it from
the ``metaworld`` package, and one short episode of a tiny policy folder through the real command.

The tests that run Meta-World skip only where the ``metaworld`` package is absent (it is in the
``sim`` extra, so CI has it); the refusals need no simulator.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dit4dit_npu.sim import metaworld_tasks as mw
from dit4dit_npu.sim.cli import eval_main

REPO = Path(__file__).resolve().parents[1]
MT_YAML = REPO / "configs" / "metaworld" / "dit4dit_metaworld_tiny.yaml"
# lerobot 0.6.1's task descriptions, where the side venv of scripts/lerobot_check.sh is built
LEROBOT_JSON = REPO / ".lerobot06/venv/lib/python3.12/site-packages/lerobot/envs/metaworld_config.json"
HAVE_METAWORLD = importlib.util.find_spec("metaworld") is not None
needs_metaworld = pytest.mark.skipif(
    not HAVE_METAWORLD, reason="metaworld is not installed (pip install 'metaworld==3.0.0'; the sim extra has it)"
)
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "DIT4DIT_DEVICE": "cpu", "PYTHONUNBUFFERED": "1"}


def one_line_refusal(capsys, tmp_path: Path, *args: str) -> str:
    out = tmp_path / "out"
    code = eval_main([*args, "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: "), err
    assert not out.exists()  # nothing written
    return err[0]


def test_an_unknown_meta_world_task_is_one_line_naming_the_tasks(tmp_path: Path, capsys) -> None:
    line = one_line_refusal(capsys, tmp_path, "--policy", str(tmp_path), "--task", "metaworld/reach-v9")
    assert line.startswith("error: --task metaworld/reach-v9: unknown Meta-World task 'reach-v9'; expected "
                           "metaworld/<task>"), line
    assert "reach-v3" in line and "window-close-v3" in line
    line = one_line_refusal(capsys, tmp_path, "--policy", str(tmp_path), "--task", "stack_cups")
    assert line == ("error: unknown task 'stack_cups'; expected one of ['insertion', 'transfer_cube'] or "
                    "metaworld/<task> (e.g. metaworld/reach-v3)")


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--max-steps", "501"], "error: --max-steps: Meta-World ends an episode at 500 steps; expected 1 to 500, got 501"),
        (["--delay-ms", "50"], "error: --delay-ms 50: --task metaworld/reach-v3 acts by hand displacements"),
    ],
)
def test_what_meta_world_cannot_run_is_one_line(tmp_path: Path, capsys, flags: list[str], expected: str) -> None:
    line = one_line_refusal(capsys, tmp_path, "--policy", str(tmp_path), "--task", "metaworld/reach-v3", *flags)
    assert line.startswith(expected), line


def test_the_scripted_aloha_policies_are_refused_for_meta_world(tmp_path: Path, capsys) -> None:
    line = one_line_refusal(capsys, tmp_path, "--scripted", "expert", "--task", "metaworld/push-v3")
    assert line == ("error: --scripted expert: the scripted policies drive the ALOHA tasks; --task metaworld/push-v3 "
                    "takes --policy DIR or --server ws://HOST:PORT")


def test_a_missing_metaworld_package_is_one_line_naming_the_install(tmp_path: Path) -> None:
    """A real process where ``import metaworld`` fails (where it is installed, a folder first on
    the path makes it fail as an absent package does)."""
    shadow = tmp_path / "shadow"
    (shadow / "metaworld").mkdir(parents=True)
    (shadow / "metaworld" / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'metaworld'\", name='metaworld')\n"
    )
    env = {**ENV, "PYTHONPATH": os.pathsep.join([str(shadow), ENV.get("PYTHONPATH", "")])}
    out = tmp_path / "out"
    r = subprocess.run(
        [sys.executable, "-m", "dit4dit_npu.sim.eval", "--policy", str(tmp_path), "--task", "metaworld/reach-v3",
         "--out", str(out)],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=300,
    )
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "error: metaworld is not installed (No module named 'metaworld'); install it: pip install "
        "'metaworld==3.0.0' (or the simulation extra: pip install -e '.[sim]')"
    ], r.stderr
    assert not out.exists()


@needs_metaworld
def test_the_task_table_is_meta_worlds_own_tasks() -> None:
    from metaworld.env_dict import ALL_V3_ENVIRONMENTS

    assert set(mw.DESCRIPTIONS) == set(ALL_V3_ENVIRONMENTS) and set(mw.MT10) <= set(mw.DESCRIPTIONS)


@pytest.mark.skipif(not LEROBOT_JSON.is_file(), reason="no lerobot 0.6 side venv: bash scripts/lerobot_check.sh builds it")
def test_each_instruction_is_lerobots_description_of_the_task() -> None:
    assert mw.DESCRIPTIONS == json.loads(LEROBOT_JSON.read_text())["TASK_DESCRIPTIONS"]


def lerobots_env(name: str, size_hw: tuple[int, int]):
    """The env as lerobot 0.6.1 builds it (``MetaworldEnv._ensure_env``), rendered as the lean env
    renders it (``lerobot_plugin/env``), written out here from their code, not from ours."""
    import metaworld

    mt1 = metaworld.MT1(name, seed=42)
    env = mt1.train_classes[name](render_mode="rgb_array", camera_name="corner2")
    env.set_task(mt1.train_tasks[0])
    env.model.cam_pos[2] = [0.75, 0.075, 0.7]
    env.reset()
    env._freeze_rand_vec = False
    env.seeded_rand_vec = True
    env.mujoco_renderer.width, env.mujoco_renderer.height = size_hw[1], size_hw[0]
    env.model.light_castshadow[:] = 0
    env.model.vis.quality.offsamples = 0
    return env


@pytest.mark.slow  # over 4 s of one core: the full tier (the fast tier keeps to 3 minutes)
@needs_metaworld
def test_the_observation_is_the_one_lerobot_gives_for_the_same_seed() -> None:
    """Same seed -> the same goal position, picture (corner2's render flipped in both axes, as
    lerobot flips it: the raw render is not what the policy sees), state (the first 4 numbers,
    float32) and instruction; another seed moves the goal; and a step keeps them equal."""
    from dit4dit_npu.sim.metaworld_scene import MetaworldScene

    size = (48, 64)  # not square: a swapped height and width shows
    action = np.array([0.5, -0.3, 0.2, 1.0], np.float32)
    scene = MetaworldScene("metaworld/reach-v3", size)
    first = scene.reset(1000)
    goal = scene.env._last_rand_vec.copy()
    after = scene.step(action)
    other = scene.reset(1001)
    other_goal = scene.env._last_rand_vec.copy()
    again = scene.reset(1000)
    scene.close()
    del scene  # before the next GL context: a freed env's context can take the next one's framebuffers

    assert not np.array_equal(goal, other_goal)  # the seed places the goal
    assert not np.array_equal(other["observation.image"], first["observation.image"])
    assert np.array_equal(again["observation.image"], first["observation.image"])
    env = lerobots_env("reach-v3", size)
    try:
        env.seed(1000)
        raw, _ = env.reset(seed=1000)
        picture = env.render()
        assert np.array_equal(env._last_rand_vec, goal)
        assert first["observation.image"].shape == picture.shape == (*size, 3)
        assert np.array_equal(first["observation.image"], np.flip(picture, (0, 1)))
        assert not np.array_equal(first["observation.image"], picture)  # the flip is not a no-op here
        assert first["state"].dtype == np.float32 and np.array_equal(first["state"], raw[:4].astype(np.float32))
        assert first["instruction"] == "Reach a goal position"
        raw, reward, _, _, info = env.step(action)
        assert np.array_equal(after.obs["observation.image"], np.flip(env.render(), (0, 1)))
        assert np.array_equal(after.obs["state"], raw[:4].astype(np.float32))
        assert after.reward == float(reward) and after.success == bool(info["success"])
    finally:
        env.close()


@pytest.fixture(scope="module")
def reach_policy(tmp_path_factory) -> Path:
    """A tiny (untrained) policy folder of Meta-World's shapes: one 32x32 camera, 4-d state and
    action, reach-v3's instruction, from a short episode recorded in the eval's own scene."""
    from policy_fixtures import build_tiny_setup

    from dit4dit_npu.data.writer import DatasetSpec, Episode, LeRobotWriter
    from dit4dit_npu.sim.metaworld_scene import MetaworldScene

    root = tmp_path_factory.mktemp("metaworld")
    actions = np.random.default_rng(0).uniform(-1, 1, (24, 4)).astype(np.float32)
    with MetaworldScene("metaworld/reach-v3", (32, 32)) as scene:
        obs = scene.reset(0)
        frames, states = [], []
        for a in actions:
            frames.append(obs[mw.CAMERA_KEY])
            states.append(obs["state"])
            obs = scene.step(a).obs
    spec = DatasetSpec(fps=mw.FPS, tasks=[mw.DESCRIPTIONS["reach-v3"]], video_keys=[mw.CAMERA_KEY],
                       motors=["hand_x", "hand_y", "hand_z", "gripper"], robot_type="sawyer")
    with LeRobotWriter(root / "data" / "reach_32", "v3.0", spec) as writer:
        writer.add_episode(Episode(np.stack(states), actions, 0), {mw.CAMERA_KEY: np.stack(frames)})
    setup = build_tiny_setup(
        root, "datasets.vla_data.data_mix=[{path: reach_32, weight: 1.0}]", "datasets.vla_data.image_size=[32, 32]",
        data_root=root / "data", yaml=MT_YAML,
    )
    return setup.policy_dir


@needs_metaworld
@pytest.mark.slow
def test_a_policy_folder_runs_a_meta_world_episode_through_the_command(tmp_path: Path, reach_policy: Path) -> None:
    out = tmp_path / "eval"
    r = subprocess.run(
        [sys.executable, "-m", "dit4dit_npu.sim.eval", "--policy", str(reach_policy), "--task", "metaworld/reach-v3",
         "--episodes", "1", "--seed", "1000", "--max-steps", "16", "--videos", "1", "--out", str(out)],
        capture_output=True, text=True, env=ENV, cwd=REPO, timeout=600,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines()[1].startswith("success ") and "Wilson CI" in r.stdout
    results = json.loads((out / "results.json").read_text())
    s, (ep,) = results["summary"], results["episodes"]
    assert (s["task"], s["episodes"], s["seeds"], s["max_steps"]) == ("metaworld/reach-v3", 1, [1000, 1000], 16)
    assert s["size_hw"] == [32, 32] and s["chunk_length"] == 8  # the policy's training size and chunk
    assert s["successes"] in (0, 1) and len(s["wilson95"]) == 2 and "successes_within_500" in s
    assert ep["error"] is None and (ep["steps"] == 16 or ep["success"]) and ep["policy_calls"] == -(-ep["steps"] // 8)
    assert ep["boundary_jerk"] is None  # hand displacements are not joint targets: no jerk reported
    assert (out / "videos" / "metaworld_reach-v3_seed001000.mp4").is_file()


@pytest.mark.slow
@pytest.mark.interop
def test_our_scene_is_lerobots_env_seed_by_seed() -> None:
    """Against lerobot's own code (its lean env, in the side venv), not a transcription of it:
    the same goal and objects, picture, state, rewards and success for each seed."""
    from test_lerobot_plugin import SIDE_PY, side

    if not SIDE_PY.is_file():
        pytest.skip("no lerobot 0.6 side venv: bash scripts/lerobot_check.sh builds it")
    r = side(str(REPO / "scripts" / "lerobot06" / "metaworld_same_scene.py"), "--tasks", "reach-v3",
             "--seeds", "1000-1002", "--size", "64", "--steps", "10")
    assert r.returncode == 0 and r.stdout.splitlines()[-1] == "same scenes: 3/3 (task, seed) pairs", r.stdout + r.stderr
