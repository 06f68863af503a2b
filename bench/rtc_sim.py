"""Closed-loop success and chunk-boundary jerk under inference delay: sync vs async vs temporal
ensembling vs real-time chunking, for a policy and for the scripted expert replayed in chunks.

    python bench/rtc_sim.py [--policy POLICY_DIR --label NAME] [--seed 0] [--episodes 10] \\
        [--delays 0,100,160,300] [--replan 6] [--out bench/results/rtc_sim] [--smoke]

Every cell is one ``python -m dit4dit_npu.sim.eval`` run (its own process; ``results.json`` kept
under ``OUT/cells/``, named by every setting that changes it, so an interrupted sweep resumes and
a run with other settings never reuses it) with ``--execution MODE --delay-ms D
--replan S``: the chunk of the observation at step k may be used from step k + ceil(D x 50 Hz)
on. Cells where max(S, d) + d exceed the chunk are skipped for the async modes (one request in
flight at a time: the robot would run out of actions before every chunk; sync just pauses
longer), and RTC is skipped for the
expert (it has no flow sampler to guide). Without ``--policy`` only the expert runs, with
``--no-expert`` only the policy; ``--include OTHER/cells.json`` adds another sweep's cells (e.g.
the expert's, run with more episodes) to the table and plot. ``bench/results/`` is not
tracked: the README's table and plot are copies in ``docs/`` (rtc_sim.md, rtc_sim.png,
rtc_sim_cells.json) of one sweep's. Writes ``OUT/cells.json``, ``OUT/table.md`` (the README
table, with each cell's wall time) and ``OUT/rtc_sim.png``.

The last line is ``speedup: X.XX`` = the policy's boundary jerk with naive async / with RTC at the
largest delay both ran (how much smoother RTC makes the hand-over between chunks); without
``--policy``, the scripted expert's boundary jerk synchronous / naive async (how much a robot that
stops while the next chunk is computed jerks more at the hand-over). ``--smoke``
(1 episode of 30 steps per cell, delays 0 and 100 ms, under ``bench/results/rtc_sim_smoke`` by
default; about a minute for the expert alone, 3 with a tiny policy: each cell is a process)
checks the script, not the method.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from dit4dit_client import MODES, delay_steps

from dit4dit_npu.console import run
from dit4dit_npu.errors import DiT4DiTError
from dit4dit_npu.files import atomic_path, atomic_write_json, atomic_write_text
from dit4dit_npu.sim.tasks import check_seed_range  # numpy only: the script stays free of MuJoCo

REPO = Path(__file__).resolve().parents[1]
FPS = 50  # dit4dit_npu.sim.tasks.FPS (not imported: this script stays free of MuJoCo)
EXPERT = "expert_chunks"
EXPERT_CHUNK = 16  # dit4dit_npu.sim.policies.EXPERT_CHUNK_LENGTH


def chunk_length(policy: str) -> int:
    if policy == EXPERT:
        return EXPERT_CHUNK
    return int(json.loads((Path(policy) / "policy_io.json").read_text())["chunk_length"])


def skip_reason(policy: str, mode: str, delay_ms: float, replan: int) -> str | None:
    if policy == EXPERT and mode == "rtc":
        return "n/a: the expert has no flow sampler to guide"
    d, h = delay_steps(delay_ms / 1e3, FPS), chunk_length(policy)
    if mode != "sync" and max(replan, d) + d > h:  # sim/rollout.py refuses these: the robot would starve
        return f"n/a: max(horizon {replan}, delay {d}) + delay > the {h}-step chunk"
    return None


def with_rewards(results: dict) -> dict:
    """The cell's summary and how many of its episodes reached each maximum reward (the issue's
    distribution beside every rate: 0 nothing, 1 touched, 2 lifted, 4 handed over, for transfer cube)."""
    counts = Counter(e["max_reward"] for e in results["episodes"])
    return {**results["summary"], "max_reward_counts": {f"{r:g}": n for r, n in sorted(counts.items())}}


def run_cell(policy: str, mode: str, delay_ms: float, a: argparse.Namespace, out: Path) -> dict:
    if (out / "results.json").exists():
        return with_rewards(json.loads((out / "results.json").read_text()))
    if out.exists():  # a killed run's partial folder
        for f in sorted(out.rglob("*"), reverse=True):
            f.unlink() if f.is_file() else f.rmdir()
        out.rmdir()
    cmd = [
        sys.executable, "-m", "dit4dit_npu.sim.eval", "--scripted" if policy == EXPERT else "--policy", policy, "--task", a.task,
        "--episodes", str(a.episodes), "--seed", str(a.seed), "--max-steps", str(a.max_steps),
        "--execution", mode, "--delay-ms", f"{delay_ms:g}", "--replan", str(a.replan),
        "--videos", "0", "--workers", str(a.workers), "--out", str(out), *(["--size", a.size] if a.size else []),
    ]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"cell failed: {' '.join(cmd)}\n{proc.stderr[-2000:]}")
    summary = with_rewards(json.loads((out / "results.json").read_text()))
    print(f"  {Path(policy).name} {mode} {delay_ms:g} ms: {summary['successes']}/{summary['episodes']}, "
          f"boundary jerk {summary['boundary_jerk']} ({time.perf_counter() - t0:.0f} s)", flush=True)
    return summary


def jerk(value: float | None) -> str:
    # None: the episodes had no step of that kind (sim/execution.py's boundary_jerk): no boundary
    # past step 3, or no interior step (with --replan 3 every step is within 3 of a boundary)
    return "–" if value is None else f"{value:,.0f}"


def table(cells: list[dict]) -> str:
    # s: the execution horizon the cell ran (actions executed per chunk; sync pauses for the delay
    # after each s, the asynchronous modes request every max(s, d) steps); within 300: gym-aloha's
    # episode length; max reward: how many episodes reached each (cells of older sweeps lack it: –)
    rows = [
        "| policy | delay | mode | s | success | within 300 steps | max reward | boundary jerk (rad/s³) "
        "| interior jerk (rad/s³) | boundary / interior | wall |",
        "| --- | --- | --- | ---: | --- | --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for c in cells:
        head = f"| {c['label']} | {c['delay_ms']:g} ms ({c['delay_steps']} steps) | {c['mode']} |"
        if c.get("skip"):
            rows.append(f"{head} | {c['skip']} | | | | | | |")
            continue
        s = c["summary"]
        lo, hi = s["wilson95"]
        ratio = f"{s['boundary_jerk'] / s['interior_jerk']:.2f}" if s["boundary_jerk"] and s["interior_jerk"] else "–"
        within = f"{s['successes_within_300']}/{s['episodes']}" if "successes_within_300" in s else "–"
        rewards = " / ".join(f"{r}: {n}" for r, n in s["max_reward_counts"].items()) if "max_reward_counts" in s else "–"
        rows.append(
            f"{head} {s.get('execution_horizon') or '–'} | {s['successes']}/{s['episodes']} ({100 * lo:.0f}–{100 * hi:.0f}%) | "
            f"{within} | {rewards} | {jerk(s['boundary_jerk'])} | {jerk(s['interior_jerk'])} | {ratio} | {s['wall_s']:.0f} s |"
        )
    return "\n".join(rows)


def plot(cells: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(dict.fromkeys(c["label"] for c in cells))
    fig, axes = plt.subplots(len(labels), 2, figsize=(10, 3.6 * len(labels)), squeeze=False)
    for row, label in zip(axes, labels):
        for mode in MODES:
            done = [c for c in cells if c["label"] == label and c["mode"] == mode and not c.get("skip")]
            if not done:
                continue
            x = [c["delay_ms"] for c in done]
            row[0].plot(x, [c["summary"]["success_rate"] for c in done], "o-", label=mode)
            row[1].plot(x, [c["summary"]["boundary_jerk"] or math.nan for c in done], "o-", label=mode)  # None: no boundary
        row[0].set(title=f"{label}: success", xlabel="inference delay (ms)", ylim=(-0.05, 1.05))
        row[1].set(title=f"{label}: jerk at chunk boundaries", xlabel="inference delay (ms)", ylabel="rad/s³")
        row[0].legend()
        row[1].legend()
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--policy", default=None, help="a policy folder (default: none); the expert control always runs")
    p.add_argument("--label", default=None, help="the policy's name in the table (default: its folder name)")
    p.add_argument("--task", default="transfer_cube")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--episodes", type=int, default=10)
    p.add_argument("--max-steps", type=int, default=400)
    p.add_argument("--delays", default="0,100,160,300", help="ms, comma-separated")
    p.add_argument("--replan", type=int, default=6, help="execution horizon s: actions executed per chunk")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--size", default=None, help="HxW per camera (default: the policy's training size; 240x320 for the expert)")
    p.add_argument("--out", type=Path, default=None, help="default: bench/results/rtc_sim (_smoke with --smoke)")
    p.add_argument("--smoke", action="store_true", help="1 episode of 30 steps per cell, delays 0,100")
    p.add_argument("--expert", action=argparse.BooleanOptionalAction, default=True,
                   help="run the scripted expert's cells too (default: yes)")
    p.add_argument("--include", type=Path, action="append", default=[],
                   help="another sweep's cells.json to add to the table and plot (repeatable)")
    a = p.parse_args()
    if a.smoke:
        a.episodes, a.max_steps, a.delays = 1, 30, "0,100"
    if not (a.policy or a.expert):
        raise DiT4DiTError("--no-expert: give --policy, else there is nothing to run")
    check_seed_range(a.seed, a.episodes)  # every cell's episodes, before the first cell runs
    a.out = a.out or REPO / "bench" / "results" / ("rtc_sim_smoke" if a.smoke else "rtc_sim")
    delays = [float(d) for d in a.delays.split(",")]
    a.out.mkdir(parents=True, exist_ok=True)
    cells = []
    runs = [(EXPERT, "scripted expert (16-step chunks)")] if a.expert else []
    if a.policy:
        runs.insert(0, (a.policy, a.label or Path(a.policy).name))
    for policy, label in runs:
        for delay in delays:
            for mode in MODES:
                cell = {"label": label, "policy": policy, "mode": mode, "delay_ms": delay,
                        "delay_steps": delay_steps(delay / 1e3, FPS)}
                cell["skip"] = skip_reason(policy, mode, delay, a.replan)
                if not cell["skip"]:
                    who = "expert" if policy == EXPERT else Path(policy).resolve().as_posix().strip("/").replace("/", "_")
                    name = (f"{who}_{a.task}_{a.size or 'native'}_seed{a.seed}_{a.episodes}ep_{a.max_steps}steps_s{a.replan}_"
                            f"{mode}_{delay:g}ms")
                    cell["summary"] = run_cell(policy, mode, delay, a, a.out / "cells" / name)
                cells.append(cell)
    atomic_write_json(a.out / "cells.json", {"args": {k: str(v) for k, v in vars(a).items()}, "cells": cells})
    for other in a.include:
        cells += json.loads(other.read_text())["cells"]
    labels = list(dict.fromkeys(c["label"] for c in cells))
    cells.sort(key=lambda c: (labels.index(c["label"]), c["delay_ms"], MODES.index(c["mode"])))
    text = table(cells)
    atomic_write_text(a.out / "table.md", text + "\n")
    plot(cells, a.out / "rtc_sim.png")
    print(text)
    headline, (worse, better) = (a.policy, ("async", "rtc")) if a.policy else (EXPERT, ("sync", "async"))
    ran = {(c["mode"], c["delay_ms"]): c["summary"]["boundary_jerk"] for c in cells
           if c["policy"] == headline and not c.get("skip")}
    both = [d for d in delays if ran.get((worse, d)) and ran.get((better, d))]
    if both:
        print(f"speedup: {ran[(worse, both[-1])] / ran[(better, both[-1])]:.2f}")


if __name__ == "__main__":
    raise SystemExit(run(main))  # user errors: one line, exit code 2 (dit4dit_npu.console)
