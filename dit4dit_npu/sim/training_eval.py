"""Closed-loop success during training (``trainer.sim_eval``): the simulator in a child process.

The trainer exports its current weights as a policy folder and calls ``evaluate``, which runs
``python -m dit4dit_npu.sim.eval`` on it in a subprocess: MuJoCo and its OpenGL stack are native
code, and a segfault, an OpenGL failure or a hang there ends only the child; the trainer logs one
warning line and trains on. Light on purpose (no MuJoCo, no torch): the config check runs when
the config loads.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

from dit4dit_npu.config import ConfigError, SimEvalConfig
from dit4dit_npu.errors import DiT4DiTError

SIM_MODULES = ("mujoco", "dm_control", "gym_aloha")
# Per episode step, generous for a CPU policy call every few steps, plus start-up (policy load,
# first renderer): a child that runs past this is stopped and the eval counts as failed.
SECONDS_PER_STEP = 0.5
STARTUP_S = 600.0


class SimEvalFailed(DiT4DiTError, RuntimeError):
    """The evaluation subprocess crashed, timed out or wrote no results (one line, with its log)."""


def check_sim_eval(cfg: SimEvalConfig) -> None:
    """One line, at config load, for an unknown task or a missing simulator extra (not hours later,
    at the first evaluation). Off (task null) checks nothing."""
    if cfg.task is None:
        return
    from dit4dit_npu.sim.tasks import TASKS  # numpy only

    if cfg.task not in TASKS:
        raise ConfigError(f"trainer.sim_eval.task: got {cfg.task!r}, expected one of {sorted(TASKS)} or null (= off)")
    missing = [m for m in SIM_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        raise ConfigError(
            f"trainer.sim_eval: the simulation extra is not installed ({', '.join(missing)} missing): "
            "pip install -e '.[sim]', or set trainer.sim_eval.task=null"
        )


def eval_command(policy_dir: Path, cfg: SimEvalConfig, output: Path) -> list[str]:
    cmd = [
        sys.executable, "-m", "dit4dit_npu.sim.eval", "--policy", str(policy_dir), "--task", str(cfg.task),
        "--episodes", str(cfg.episodes), "--seed", str(cfg.seed), "--max-steps", str(cfg.max_steps),
        "--workers", str(cfg.workers), "--videos", "0", "--out", str(output),
    ]
    if cfg.size is not None:
        cmd += ["--size", f"{cfg.size[0]}x{cfg.size[1]}"]
    if cfg.replan is not None:
        cmd += ["--replan", str(cfg.replan)]
    return cmd


def evaluate(policy_dir: Path, cfg: SimEvalConfig, output: Path) -> dict[str, float]:
    """Run the eval of ``policy_dir`` into ``output`` (results.json, eval.log) -> the metrics the
    trainer logs: ``sim/success_rate``, ``sim/mean_max_reward`` (the episodes' highest reward
    stage, 0-4 on both ALOHA tasks: partial progress that a 0% success rate hides)."""
    output.mkdir(parents=True, exist_ok=True)
    log = output / "eval.log"
    timeout = STARTUP_S + SECONDS_PER_STEP * cfg.max_steps * cfg.episodes / cfg.workers
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(log, "w") as f:
        try:
            code = subprocess.run(
                eval_command(policy_dir, cfg, output), stdout=f, stderr=subprocess.STDOUT, env=env, timeout=timeout
            ).returncode
        except subprocess.TimeoutExpired:
            raise SimEvalFailed(f"no result within {timeout:.0f} s (see {log})") from None
    results = output / "results.json"
    if code != 0 or not results.is_file():
        last = [line for line in log.read_text(errors="replace").splitlines() if line.strip()][-1:] or ["no output"]
        raise SimEvalFailed(f"exit code {code}: {last[0].strip()[:300]} (see {log})")
    episodes = json.loads(results.read_text())["episodes"]
    n = len(episodes)
    return {
        "sim/success_rate": sum(e["success"] for e in episodes) / n,
        "sim/mean_max_reward": sum(e["max_reward"] for e in episodes) / n,
    }
