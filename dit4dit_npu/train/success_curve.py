"""Closed-loop success vs training steps, next to the held-out open-loop error at the same steps.

    python -m dit4dit_npu.train.success_curve --run runs/aloha_recipe [--task transfer_cube] [--episodes 50] [--seed 0] \
        [--replan K] [--workers W] [--out docs/aloha_success_vs_steps.png]   (console script dit4dit-sim-success-curve)

Evaluates every saved checkpoint of the run (``checkpoints/step_*/policy``) with
``python -m dit4dit_npu.sim.eval`` (in this process) on seeds S..S+N-1 (results kept in ``RUN/sim_curve/step_N/``:
a rerun evaluates only what is missing), reads ``val/action_mse`` at the same steps from
``metrics.jsonl``, and plots both against the step: does the open-loop error predict success?
Prints one row per checkpoint; the last line is the last checkpoint's ``success k/N = p% (95%
Wilson CI)``.

    python bench/sim_replay.py --smoke && \
        python -m dit4dit_npu.train.success_curve --smoke --run runs/sim_replay_smoke/replay1   # 96 s at load 11

``--smoke`` evaluates one 16-step episode per checkpoint and writes the plot into the run folder
(``RUN/sim_curve/``), never over the committed one in docs/.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from dit4dit_npu.errors import DiT4DiTError
from dit4dit_npu.files import atomic_write_json
from dit4dit_npu.sim.success_rate import format_rate, wilson_interval
from dit4dit_npu.train.metrics import read_metrics


def evaluate(policy: Path, out: Path, a: argparse.Namespace) -> dict:
    """``python -m dit4dit_npu.sim.eval`` of one checkpoint, run in this process (each start of a
    new one would spend ~10 s importing torch and diffusers; the episodes are the same)."""
    from dit4dit_npu.sim.cli import eval_main as sim_eval

    if not (out / "results.json").exists():
        argv = [
            "--policy", str(policy), "--task", a.task, "--episodes", str(a.episodes), "--seed", str(a.seed), "--max-steps",
            str(a.max_steps), "--workers", str(a.workers), "--videos", "0", "--out", str(out),
        ]
        if a.replan is not None:
            argv += ["--replan", str(a.replan)]
        print("+ python -m dit4dit_npu.sim.eval", " ".join(argv), flush=True)
        code = sim_eval(argv)
        if code != 0:
            raise DiT4DiTError(f"the eval of {policy} exited with code {code}")
    return json.loads((out / "results.json").read_text())["summary"]


def plot(rows: list[dict], out: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in rows]
    rate = [100 * r["successes"] / r["episodes"] for r in rows]
    lo = [100 * r["wilson95"][0] for r in rows]
    hi = [100 * r["wilson95"][1] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.errorbar(steps, rate, yerr=[[r - a for r, a in zip(rate, lo)], [b - r for r, b in zip(rate, hi)]],
                fmt="o-", color="tab:blue", capsize=4, label="closed-loop success (95% Wilson CI)")
    ax.set_xlabel("training step")
    ax.set_ylabel("success rate (%)", color="tab:blue")
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    mse = [(r["step"], r["val_action_mse"]) for r in rows if r["val_action_mse"] is not None]
    if mse:
        ax2 = ax.twinx()
        ax2.plot(*zip(*mse), "s--", color="tab:red", label="held-out action MSE (open loop)")
        ax2.set_ylabel("held-out action MSE (normalized)", color="tab:red")
        ax2.set_yscale("log")
        lines = ax.get_legend_handles_labels()[0] + ax2.get_legend_handles_labels()[0]
        ax.legend(lines, [h.get_label() for h in lines], loc="upper right", fontsize=8)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def curve(a: argparse.Namespace) -> int:
    """Every checkpoint of ``a.run`` evaluated (or its kept result read), the rows and the plot
    written; ``a`` holds the command's checked flags (train/ops_cli.py's ``success_curve_main``)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    ckpts = sorted((a.run / "checkpoints").glob("step_*/policy"))
    if not ckpts:
        raise DiT4DiTError(f"--run: no checkpoints/step_*/policy under {a.run}")
    mse = {m["step"]: m["val/action_mse"] for m in read_metrics(a.run / "metrics.jsonl") if "val/action_mse" in m}
    suffix = ("" if a.replan is None else f"_replan{a.replan}") + ("" if a.max_steps == 400 else f"_len{a.max_steps}")
    rows = []
    for policy in ckpts:
        step = int(policy.parent.name.split("_")[1])
        s = evaluate(policy, a.run / "sim_curve" / f"{policy.parent.name}_seed{a.seed}x{a.episodes}{suffix}", a)
        k, n = s["successes"], s["episodes"]
        rows.append({"step": step, "successes": k, "episodes": n, "wilson95": list(wilson_interval(k, n)),
                     "val_action_mse": mse.get(step), "eval_wall_s": s["wall_s"]})
        val = f"{mse[step]:.4f}" if step in mse else "n/a"
        print(f"step {step}: held-out action MSE {val} | closed loop {format_rate(k, n)} | eval {s['wall_s']:.0f} s",
              flush=True)
    atomic_write_json(a.run / "sim_curve" / f"curve_seed{a.seed}x{a.episodes}{suffix}.json", rows)
    plot(rows, a.out, f"{a.label or a.run.name}: ALOHA {a.task.replace('_', ' ')}, seeds {a.seed}-{a.seed + a.episodes - 1}")
    print(f"plot -> {a.out}")
    print(f"success {format_rate(rows[-1]['successes'], rows[-1]['episodes'])}")
    return 0


if __name__ == "__main__":  # python -m dit4dit_npu.train.success_curve: the command is train/ops_cli.py's
    from dit4dit_npu.train.ops_cli import success_curve_main

    raise SystemExit(success_curve_main())
