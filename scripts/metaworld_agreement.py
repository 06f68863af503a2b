"""Two referees of one policy on the same Meta-World seeds: this project's sim eval and lerobot-eval.

    python scripts/metaworld_agreement.py --ours OWN_EVAL_DIR --lerobot LEROBOT_EVAL_DIR [--tasks reach-v3,...]

OWN_EVAL_DIR holds ``python -m dit4dit_npu.sim.eval --task metaworld/<task>`` runs, one folder per
task and seed range, each named ``<task>_...`` with its ``results.json``; LEROBOT_EVAL_DIR holds
lerobot-eval's ``<task>/eval_info.json`` (its episode i is seed ``--seed`` + i, lerobot-eval's
``start_seed`` + i with ``--eval.batch_size=1``). Only the seeds both ran are compared. Prints a
markdown table: per task and over all, each harness's successes with a 95% Wilson interval, the
two-sided p of Fisher's exact test of equal rates (the two as independent samples), and on the
paired seeds how many outcomes agree and the exact McNemar p (the discordant seeds, one harness's
success against the other's failure, binomial at 1/2). No test says "equal": a large p says the
difference is within what the seeds' noise makes.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from scipy.stats import binomtest, fisher_exact

from dit4dit_npu.console import entry_point
from dit4dit_npu.sim.errors import SimError
from dit4dit_npu.sim.metaworld_tasks import MT10
from dit4dit_npu.sim.success_rate import format_rate


def read_json(path: Path, what: str) -> dict:
    """A results file, or one line naming it and what was expected (exit code 2)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise SimError(f"{path}: expected {what} ({type(e).__name__}: {e})") from None


def ours(folder: Path, task: str) -> dict[int, bool]:
    out: dict[int, bool] = {}
    for run in sorted(folder.glob(f"{task}_*/results.json")):
        episodes = read_json(run, "the sim eval's results.json").get("episodes")
        if not isinstance(episodes, list):
            raise SimError(f"{run}: expected the sim eval's results.json (an 'episodes' list)")
        out.update({e["seed"]: bool(e["success"]) for e in episodes})
    return out


def lerobots(folder: Path, task: str, seed0: int) -> dict[int, bool]:
    path = folder / task / "eval_info.json"
    per_task = read_json(path, "lerobot-eval's eval_info.json of one task").get("per_task")
    if not (isinstance(per_task, list) and len(per_task) == 1):
        raise SimError(f"{path}: expected lerobot-eval's eval_info.json of one task (one 'per_task' entry)")
    return {seed0 + i: bool(s) for i, s in enumerate(per_task[0]["metrics"]["successes"])}


def row(name: str, a: list[bool], b: list[bool]) -> str:
    n, ka, kb = len(a), sum(a), sum(b)
    p_fisher = fisher_exact([[ka, n - ka], [kb, n - kb]])[1]
    only_a = sum(x and not y for x, y in zip(a, b))
    only_b = sum(y and not x for x, y in zip(a, b))
    p_mcnemar = binomtest(only_a, only_a + only_b, 0.5).pvalue if only_a + only_b else 1.0
    return (f"| {name} | {format_rate(ka, n)} | {format_rate(kb, n)} | {p_fisher:.2f} | "
            f"{n - only_a - only_b}/{n} ({only_a} ours only, {only_b} lerobot's only) | {p_mcnemar:.2f} |")


@entry_point
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ours", type=Path, required=True, help="folder of our sim eval's <task>_* runs")
    p.add_argument("--lerobot", type=Path, required=True, help="folder of lerobot-eval's <task>/eval_info.json")
    p.add_argument("--tasks", default=",".join(MT10), help="comma-separated tasks (default: MT10's ten)")
    p.add_argument("--seed", type=int, default=1000, help="lerobot-eval's --seed (default 1000)")
    a = p.parse_args(argv)
    for flag, folder in (("--ours", a.ours), ("--lerobot", a.lerobot)):
        if not folder.is_dir():
            raise SimError(f"{flag} {folder}: expected a folder of eval results")
    print("| task | our sim eval | lerobot-eval | Fisher p | same outcome, seed by seed | McNemar p |")
    print("| --- | --- | --- | ---: | --- | ---: |")
    all_a: list[bool] = []
    all_b: list[bool] = []
    for task in [t.strip() for t in a.tasks.split(",") if t.strip()]:
        mine, theirs = ours(a.ours, task), lerobots(a.lerobot, task, a.seed)
        seeds = sorted(set(mine) & set(theirs))
        if not seeds:
            print(f"| {task} | no seeds in common | | | | |")
            continue
        xs, ys = [mine[s] for s in seeds], [theirs[s] for s in seeds]
        all_a += xs
        all_b += ys
        print(row(f"{task} (seeds {seeds[0]}-{seeds[-1]})", xs, ys))
    if all_a:
        print(row("all", all_a, all_b))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
