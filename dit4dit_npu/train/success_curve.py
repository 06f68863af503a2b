"""Closed-loop success vs training steps (or training time), next to the held-out open-loop error at the same steps.

    python -m dit4dit_npu.train.success_curve --run runs/aloha_recipe [--task transfer_cube] [--episodes 50] [--seed 0] \
        [--replan K] [--workers W] [--out docs/aloha_success_vs_steps.png]   (console script dit4dit-sim-success-curve)
    python -m dit4dit_npu.train.success_curve --run RUN_A --run RUN_B [--label A --label B] --x time \
        --out curve.png --table curve.md   # several runs on one figure, against training time

Evaluates every saved checkpoint of the run (``checkpoints/step_*/policy``) with
``python -m dit4dit_npu.sim.eval`` (in this process) on seeds S..S+N-1 (results kept in ``RUN/sim_curve/step_N/``:
a rerun evaluates only what is missing), reads ``val/action_mse`` at the same steps from
``metrics.jsonl``, and plots both against the step: does the open-loop error predict success?
Prints one row per checkpoint; the last line is the last checkpoint's ``success k/N = p% (95%
Wilson CI)`` (several runs: one such line per run, prefixed by its label, the last run's last).
``--x time`` puts each checkpoint at the training seconds it records (``trainer.max_train_time_s``'s
count: start-up, data and cache building, evaluations and saves excluded), in minutes of the clock
the checkpoints record (``trainer.train_time_clock``: wall, or the process's CPU time; the axis
says which, or that they do not say); a checkpoint
that does not record them is refused, before any evaluation.

    python bench/sim_replay.py --smoke && \
        python -m dit4dit_npu.train.success_curve --smoke --run runs/sim_replay_smoke/replay1   # 96 s at load 11

``--intermediate-episodes M`` evaluates every checkpoint but each run's last on M episodes only
(seeds S..S+M-1, a subset of the last one's): the curve's shape at a fraction of its cost, the
headline (the last checkpoint) on all N.

``--smoke`` evaluates one 16-step episode per checkpoint and writes the plot into the run folder
(``RUN/sim_curve/``), never over the committed one in docs/.
"""

from __future__ import annotations

import argparse
import json
import os
import textwrap
from pathlib import Path

from dit4dit_npu.errors import DiT4DiTError
from dit4dit_npu.files import atomic_write_json, atomic_write_text
from dit4dit_npu.sim.success_rate import format_rate, wilson_interval
from dit4dit_npu.train.metrics import read_metrics


def evaluate(policy: Path, out: Path, episodes: int, a: argparse.Namespace) -> dict:
    """``python -m dit4dit_npu.sim.eval`` of one checkpoint on ``episodes`` episodes, run in this
    process (each start of a new one would spend ~10 s importing torch and diffusers; the episodes are
    the same)."""
    from dit4dit_npu.sim.cli import eval_main as sim_eval

    if not (out / "results.json").exists():
        argv = [
            "--policy", str(policy), "--task", a.task, "--episodes", str(episodes), "--seed", str(a.seed), "--max-steps",
            str(a.max_steps), "--workers", str(a.workers), "--videos", "0", "--out", str(out),
        ]
        if a.replan is not None:
            argv += ["--replan", str(a.replan)]
        if a.episode_timeout is not None:
            argv += ["--episode-timeout", str(a.episode_timeout)]
        print("+ python -m dit4dit_npu.sim.eval", " ".join(argv), flush=True)
        code = sim_eval(argv)
        if code != 0:
            raise DiT4DiTError(f"the eval of {policy} exited with code {code}")
    return json.loads((out / "results.json").read_text())["summary"]


def time_axis(clocks: set) -> str:
    """What --x time's minutes are, from the clocks the checkpoints record (trainer.train_time_clock:
    wall, or process_cpu on a shared host); a checkpoint that predates the record says nothing."""
    if clocks == {"wall"}:
        return "training wall time"
    if clocks == {"process_cpu"}:
        return "training CPU time (one thread)"
    return "training time (each run's budget clock)"


def plot(curves: list[tuple[str, list[dict]]], out: Path, title: str, x: str, axis: str = "") -> None:
    """Success (with its 95% Wilson interval) of every run on one axis, the held-out error of each
    on a second one, in the run's colour; x: the training step, or training minutes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    ax2 = None
    several = len(curves) > 1
    for i, (label, rows) in enumerate(curves):
        color = f"C{i}" if several else "tab:blue"
        xs = [_x(r, x) for r in rows]
        rate = [100 * r["successes"] / r["episodes"] for r in rows]
        lo = [100 * r["wilson95"][0] for r in rows]
        hi = [100 * r["wilson95"][1] for r in rows]
        ax.errorbar(xs, rate, yerr=[[r - a for r, a in zip(rate, lo)], [b - r for r, b in zip(rate, hi)]],
                    fmt="o-", color=color, capsize=4,
                    label=f"{label}: success" if several else "closed-loop success (95% Wilson CI)")
        mse = [(_x(r, x), r["val_action_mse"]) for r in rows if r["val_action_mse"] is not None]
        if mse:
            ax2 = ax2 or ax.twinx()
            ax2.plot(*zip(*mse), "s--", color=color if several else "tab:red", alpha=0.6 if several else 1.0,
                     label=f"{label}: held-out MSE" if several else "held-out action MSE (open loop)")
    ax.set_xlabel("training step" if x == "step" else f"{axis} (min; start-up, caches, evals and saves excluded)")
    ax.set_ylabel("success rate (%)" + (" (95% Wilson CI)" if several else ""), color="black" if several else "tab:blue")
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    lines = ax.get_legend_handles_labels()[0]
    if ax2 is not None:
        ax2.set_ylabel("held-out action MSE (normalized)", color="black" if several else "tab:red")
        ax2.set_yscale("log")
        lines += ax2.get_legend_handles_labels()[0]
    if several or ax2 is not None:
        ax.legend(lines, [h.get_label() for h in lines], loc="upper right", fontsize=7 if several else 8)
    # Wrapped: a title of several runs and seed ranges is wider than the figure, and
    # tight_layout does not shrink a title, it cuts it at the figure's edges.
    ax.set_title("\n".join(textwrap.wrap(title, 90)), fontsize=9)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def _x(row: dict, x: str) -> float:
    return row["step"] if x == "step" else row["train_time_s"] / 60


def train_seconds(policy: Path) -> float:
    """The training seconds the checkpoint of ``policy`` records (``trainer.max_train_time_s``'s
    count: train/budget.py)."""
    return float(train_time(policy)[0])


def train_time(policy: Path) -> tuple[float, str | None]:
    """(seconds, clock) the checkpoint of ``policy`` records: the budget's count and its clock
    (``trainer.train_time_clock``; None from a version that did not record it)."""
    from dit4dit_npu.train.checkpoint import read_trainer_state

    try:
        state = read_trainer_state(policy.parent)
        seconds = state.get("train_time_s")
    except Exception as e:  # a missing or damaged trainer_state.pt: pickle and torch raise many types
        raise DiT4DiTError(f"--x time: cannot read {policy.parent / 'trainer_state.pt'} ({type(e).__name__})") from None
    if seconds is None:
        raise DiT4DiTError(
            f"--x time: {policy.parent} does not record its training time (a checkpoint of an older version, or "
            "of a run resumed from one); plot it with --x step"
        )
    return float(seconds), state.get("train_time_clock")


def write_table(curves: list[tuple[str, list[dict]]], out: Path) -> None:
    """Every checkpoint of every run as one Markdown table."""
    lines = ["| run | step | training min | closed-loop success | 95% Wilson CI | held-out action MSE |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for label, rows in curves:
        for r in rows:
            t = "n/a" if r.get("train_time_s") is None else f"{r['train_time_s'] / 60:.2f}"
            mse = "n/a" if r["val_action_mse"] is None else f"{r['val_action_mse']:.4f}"
            lo, hi = r["wilson95"]
            lines.append(f"| {label} | {r['step']} | {t} | {r['successes']}/{r['episodes']} = "
                         f"{100 * r['successes'] / r['episodes']:.1f}% | {100 * lo:.1f}-{100 * hi:.1f}% | {mse} |")
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, "\n".join(lines) + "\n")


def intermediate_episodes(a: argparse.Namespace) -> int:
    """Episodes for each checkpoint before a run's last (--intermediate-episodes; default --episodes):
    fewer there make a curve of many checkpoints affordable while the last one, the headline, keeps
    its full count."""
    return a.episodes if a.intermediate_episodes is None else a.intermediate_episodes


def run_curve(run: Path, label: str, a: argparse.Namespace) -> list[dict]:
    """Evaluate (or read the kept results of) every checkpoint of ``run``; one printed row each."""
    ckpts = sorted((run / "checkpoints").glob("step_*/policy"))
    mse = {m["step"]: m["val/action_mse"] for m in read_metrics(run / "metrics.jsonl") if "val/action_mse" in m}
    seconds = {p: train_seconds(p) for p in ckpts} if a.x == "time" else {}  # every one, before the first eval
    suffix = ("" if a.replan is None else f"_replan{a.replan}") + ("" if a.max_steps == 400 else f"_len{a.max_steps}")
    rows = []
    for policy in ckpts:
        step = int(policy.parent.name.split("_")[1])
        n = a.episodes if policy == ckpts[-1] else intermediate_episodes(a)
        s = evaluate(policy, run / "sim_curve" / f"{policy.parent.name}_seed{a.seed}x{n}{suffix}", n, a)
        k, n = s["successes"], s["episodes"]
        rows.append({"step": step, "successes": k, "episodes": n, "wilson95": list(wilson_interval(k, n)),
                     "val_action_mse": mse.get(step), "eval_wall_s": s["wall_s"], "train_time_s": seconds.get(policy)})
        val = f"{mse[step]:.4f}" if step in mse else "n/a"
        when = f"step {step}" + (f" ({seconds[policy] / 60:.1f} training min)" if policy in seconds else "")
        print(f"{label + ': ' if len(a.run) > 1 else ''}{when}: held-out action MSE {val} | closed loop "
              f"{format_rate(k, n)} | eval {s['wall_s']:.0f} s", flush=True)
    mid = "" if intermediate_episodes(a) == a.episodes else f"_earlier{intermediate_episodes(a)}"
    atomic_write_json(run / "sim_curve" / f"curve_seed{a.seed}x{a.episodes}{mid}{suffix}.json", rows)
    return rows


def curve(a: argparse.Namespace) -> int:
    """Every checkpoint of every ``a.run`` evaluated (or its kept result read), the rows, the plot
    (and with ``a.table`` the table) written; ``a`` holds the command's checked flags
    (train/ops_cli.py's ``success_curve_main``)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    labels = a.label or [r.name for r in a.run]
    clocks = set()
    for run in a.run:  # every run's checkpoints, and with --x time their training seconds, before any eval
        ckpts = sorted((run / "checkpoints").glob("step_*/policy"))
        if not ckpts:
            raise DiT4DiTError(f"--run: no checkpoints/step_*/policy under {run}")
        if a.x == "time":
            clocks |= {train_time(policy)[1] for policy in ckpts}
    curves = [(label, run_curve(run, label, a)) for run, label in zip(a.run, labels)]
    seeds = f"seeds {a.seed}-{a.seed + a.episodes - 1}"
    if intermediate_episodes(a) != a.episodes:
        seeds += f" (earlier checkpoints {a.seed}-{a.seed + intermediate_episodes(a) - 1})"
    title = (f"{labels[0]}: ALOHA {a.task.replace('_', ' ')}, {seeds}" if len(curves) == 1
             else f"ALOHA {a.task.replace('_', ' ')}, {seeds}, success against training "
                  f"{'step' if a.x == 'step' else time_axis(clocks).removeprefix('training ')}")
    plot(curves, a.out, title, a.x, time_axis(clocks))
    print(f"plot -> {a.out}")
    if a.table is not None:
        write_table(curves, a.table)
        print(f"table -> {a.table}")
    for label, rows in curves:
        print(f"{label + ': ' if len(curves) > 1 else ''}success {format_rate(rows[-1]['successes'], rows[-1]['episodes'])}")
    return 0


if __name__ == "__main__":  # python -m dit4dit_npu.train.success_curve: the command is train/ops_cli.py's
    from dit4dit_npu.train.ops_cli import success_curve_main

    raise SystemExit(success_curve_main())
