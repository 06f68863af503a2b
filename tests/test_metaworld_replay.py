"""scripts/metaworld_replay_lerobot.py: every argument is checked in one line (exit code 2) before a
child process loads the policy; a policy is not needed for these."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "metaworld_replay_lerobot.py"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)


def test_bad_arguments_are_one_line_before_any_policy_loads(tmp_path: Path) -> None:
    policy, lr = tmp_path / "policy", tmp_path / "lerobot"
    policy.mkdir()  # an empty folder: a child would fail to load it, so a refusal here never reached one
    (lr / "reach-v3").mkdir(parents=True)
    info = lr / "reach-v3" / "eval_info.json"
    info.write_text(json.dumps({"per_task": [{"metrics": {"successes": [True] * 2, "sum_rewards": [1.0] * 2}}]}))
    base = ["--policy", str(policy), "--lerobot", str(lr), "--tasks", "reach-v3", "--episodes", "2"]
    cases = [
        (["--rng-seed", "-1"], "error: --rng-seed -1: expected a seed in [0, 2**32)"),
        (["--rng-seed", str(2**32)], f"error: --rng-seed {2**32}: expected a seed in [0, 2**32)"),
        (["--seed", str(2**32 - 1)], f"error: --seed {2**32 - 1} with --episodes 2: the episodes' seeds are"),
        (["--episodes", "3"], f"error: --episodes 3: {info} holds 2 episode(s)"),
        (["--tasks", "push-v3"], f"error: --lerobot: {lr / 'push-v3' / 'eval_info.json'}: expected lerobot-eval's"),
        (["--tasks", " , "], "error: --tasks ' , ': expected comma-separated Meta-World tasks"),
        (["--policy", str(tmp_path / "nowhere")], f"error: --policy: '{tmp_path / 'nowhere'}' is not a policy folder"),
    ]
    for extra, message in cases:
        r = run(*base, *extra)
        lines = r.stderr.strip().splitlines()
        assert (r.returncode, len(lines)) == (2, 1) and lines[0].startswith(message), (extra, r.stderr)
        assert r.stdout == "", extra  # no child ran
