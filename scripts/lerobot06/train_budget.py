"""lerobot-train for a budget of process CPU time, as this project's training is budgeted (runs in the
lerobot 0.6 side venv; standard library only).

    python train_budget.py --cpu-seconds 2400 --out OUT -- --policy.type=act --dataset.root=... [...]

The flags after ``--`` go to lerobot-train (the side venv's, next to this Python) verbatim, with
``--output_dir=OUT`` added. lerobot-train counts steps; the comparison with DiT4DiT is at equal CPU
time (``trainer.train_time_clock=process_cpu``: runs that share cores get equal compute), so this
reads the trainer's CPU time (utime+stime+cutime+cstime of /proc/<pid>/stat) once a second and stops
it at the budget (SIGTERM, then SIGKILL after a deadline). The policy kept is the newest checkpoint
complete by then; so lerobot-train should checkpoint often (``--save_freq``): what is trained after
it is lost. Only the newest 2 complete checkpoints are kept (an ACT one is ~600 MB).

OUT/budget.json then holds the checkpoint's ``pretrained_model`` path (what lerobot-eval's
``--policy.path`` takes), its step, the CPU seconds at which it was seen complete, the total CPU and
wall seconds; one line says the same. A rerun with OUT/budget.json there reuses it; an OUT without
it (a run cut short) is removed and trained again, since lerobot-train refuses an existing output
folder. lerobot-train's output goes to OUT.log. Exit codes: 0 done, 1 lerobot-train failed (one line
naming its log), 2 a bad flag of this script (one line).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

KEEP = 2
POLL_S = 1.0
# After SIGTERM lerobot-train has this long to end (Python's default SIGTERM ends it at once; a
# checkpoint half written is not a complete one and is removed), then SIGKILL and as long again.
STOP_DEADLINE_S = 30.0
TICK = os.sysconf("SC_CLK_TCK")


class Refused(Exception):
    """A bad flag of this script: one line, exit code 2."""


class Failed(Exception):
    """lerobot-train did not give a checkpoint: one line, exit code 1."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, not argparse's usage block
        raise Refused(message)


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    if "--" not in argv:
        raise Refused("expected `-- <lerobot-train flags>` after train_budget.py's own flags")
    cut = argv.index("--")
    p = Parser(prog="train_budget.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--cpu-seconds", type=float, required=True, help="the budget: lerobot-train's process CPU seconds")
    p.add_argument("--out", type=Path, required=True, help="lerobot-train's --output_dir; OUT/budget.json the result")
    p.add_argument("--max-wall-seconds", type=float, default=None,
                   help="give up when the budget is not spent by then (default: 20 x the budget + 10 minutes: "
                        "a trainer that idles is stuck, not slow)")
    p.add_argument("--lerobot-train", type=Path, default=Path(sys.executable).parent / "lerobot-train",
                   help="the lerobot-train executable (default: the one next to this Python)")
    args, rest = p.parse_known_args(argv[:cut])
    if rest:
        raise Refused(f"{' '.join(rest)}: not a flag of train_budget.py (lerobot-train's go after --)")
    args.out = args.out.absolute()  # budget.json's path then serves from any folder
    if not (math.isfinite(args.cpu_seconds) and args.cpu_seconds > 0):
        raise Refused(f"--cpu-seconds {args.cpu_seconds:g}: expected a number of CPU seconds > 0")
    if args.max_wall_seconds is None:
        args.max_wall_seconds = 20 * args.cpu_seconds + 600
    elif not (math.isfinite(args.max_wall_seconds) and args.max_wall_seconds > 0):
        raise Refused(f"--max-wall-seconds {args.max_wall_seconds:g}: expected a number of seconds > 0")
    flags = argv[cut + 1:]
    if not flags:
        raise Refused("expected lerobot-train's flags after --")
    for f in flags:
        if f.split("=")[0] == "--output_dir":
            raise Refused(f"{f}: train_budget.py sets it (--out)")
    if not os.access(args.lerobot_train, os.X_OK):
        raise Refused(f"--lerobot-train {args.lerobot_train}: expected the side venv's lerobot-train executable")
    return args, flags


def cpu_seconds(pid: int) -> float:
    """utime + stime + cutime + cstime (fields 14-17); the command name before them may hold spaces."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / TICK


def complete(out: Path) -> list[tuple[int, Path]]:
    """The checkpoints lerobot-train has finished writing: it points ``last`` at one only after
    writing it, so those up to ``last``'s step are whole; a newer folder is still being written."""
    ckpts = out / "checkpoints"
    try:
        last = int(os.readlink(ckpts / "last"))
    except (OSError, ValueError):  # none yet, or ``last`` between its unlink and its new link
        return []
    return sorted((int(d.name), d) for d in ckpts.iterdir() if d.name.isdigit() and int(d.name) <= last)


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM to lerobot-train's process group, then SIGKILL; each wait has its deadline."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=STOP_DEADLINE_S)
            return
        except subprocess.TimeoutExpired:
            pass
    raise Failed(f"lerobot-train (pid {proc.pid}) did not end {2 * STOP_DEADLINE_S:g} s after SIGTERM and SIGKILL")


def train(args: argparse.Namespace, flags: list[str]) -> dict:
    out, log = args.out, args.out.with_name(args.out.name + ".log")
    t0 = time.monotonic()
    seen: dict[int, float] = {}  # step -> the CPU seconds when it was first seen complete
    cpu, over = 0.0, None
    with open(log, "w") as logf:
        # its own session: the stop reaches any process it starts, and a terminal's Ctrl-C reaches
        # this watcher, which then stops it (below) rather than leaving it to run on
        proc = subprocess.Popen([str(args.lerobot_train), *flags, f"--output_dir={out}"],
                                stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            while proc.poll() is None:
                try:
                    cpu = cpu_seconds(proc.pid)
                except (FileNotFoundError, ProcessLookupError):  # ended between poll() and here
                    continue
                ckpts = complete(out)
                for step, _ in ckpts:
                    seen.setdefault(step, cpu)
                # the newest 2, and never the newest seen within the budget: the one kept if the
                # budget ends at this poll
                kept = max((s for s in seen if seen[s] <= args.cpu_seconds), default=None)
                for step, old in ckpts[:-KEEP]:
                    if step != kept:
                        shutil.rmtree(old, ignore_errors=True)
                if cpu >= args.cpu_seconds:
                    over = "budget"
                elif time.monotonic() - t0 > args.max_wall_seconds:
                    over = "wall"
                if over:
                    break
                time.sleep(POLL_S)
        finally:
            stop(proc)
    wall = time.monotonic() - t0
    # lerobot-train is the one child waited for: its CPU time with its own waited-for children
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = max(cpu, usage.ru_utime + usage.ru_stime)
    if over == "wall":
        raise Failed(f"lerobot-train used {total:.0f} of {args.cpu_seconds:g} CPU-s in {wall:.0f} s of wall time "
                     f"(--max-wall-seconds {args.max_wall_seconds:g}) (log: {log})")
    if over is None and proc.returncode != 0:
        tail = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
        raise Failed(f"lerobot-train exited with code {proc.returncode} before the budget: "
                     f"{tail[-1] if tail else '(no output)'} (log: {log})")
    # At the budget only checkpoints seen complete within it count; when lerobot-train ended by
    # itself (its --steps done) its last checkpoint does, seen or not between two polls.
    ckpts = complete(out)
    within = [(s, d) for s, d in ckpts if (s in seen and seen[s] <= args.cpu_seconds) or over is None]
    for s, d in ckpts:
        if (s, d) not in within[-KEEP:]:
            shutil.rmtree(d, ignore_errors=True)
    for d in (out / "checkpoints").glob("[0-9]*"):  # one cut short by the stop
        if d.is_dir() and d not in [c for _, c in within]:
            shutil.rmtree(d, ignore_errors=True)
    if not within:
        raise Failed(f"no checkpoint was complete within {args.cpu_seconds:g} CPU-s (total {total:.0f}): "
                     f"a larger budget or a smaller --save_freq (log: {log})")
    step, ckpt = within[-1]
    last = out / "checkpoints" / "last"  # lerobot's pointer, at the checkpoint kept (it may name one removed)
    last.unlink(missing_ok=True)
    last.symlink_to(ckpt.name)
    return {"pretrained_model": str(ckpt / "pretrained_model"), "step": step,
            "checkpoint_cpu_s": round(seen.get(step, total), 2), "cpu_s": round(total, 2), "wall_s": round(wall, 1),
            "budget_cpu_s": args.cpu_seconds, "stopped_by": "budget" if over else "lerobot-train's --steps"}


def line(r: dict) -> str:
    return (f"train_budget: step {r['step']} (its checkpoint complete at {r['checkpoint_cpu_s']:.0f} CPU-s), "
            f"{r['cpu_s']:.0f} CPU-s in all, {r['wall_s']:.0f} s wall, budget {r['budget_cpu_s']:g} CPU-s, "
            f"stopped by {r['stopped_by']}: {r['pretrained_model']}")


def main(argv: list[str]) -> int:
    args, flags = parse(argv)
    result = args.out / "budget.json"
    if result.is_file():
        r = json.loads(result.read_text())
        if r.get("budget_cpu_s") != args.cpu_seconds:
            raise Refused(f"--out {args.out}: its budget.json is of a budget of {r.get('budget_cpu_s')} CPU-s, "
                          f"not {args.cpu_seconds:g} (another --out)")
        print(f"reusing {result}: {line(r)}")
        return 0
    if args.out.exists():
        print(f"train_budget: {args.out} has no budget.json (a run cut short): removed, trained again", file=sys.stderr)
        shutil.rmtree(args.out)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    r = train(args, flags)
    tmp = result.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(r, indent=1) + "\n")
    os.replace(tmp, result)  # budget.json is there only whole: a rerun trusts it
    print(line(r))
    return 0


if __name__ == "__main__":
    # SIGTERM to this watcher stops lerobot-train too (train()'s finally), as Ctrl-C does
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        sys.exit(main(sys.argv[1:]))
    except Refused as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except Failed as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print("error: interrupted: lerobot-train stopped, no budget.json written", file=sys.stderr)
        sys.exit(130)
