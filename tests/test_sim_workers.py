"""The waits between a simulation command and its spawned workers (sim/workers.py) end: a worker's
error is one line, a worker that dies or stays silent past the deadline is an error, not a wait
forever, and workers whose parent is gone exit. The demos' workers (sim/demos.py's
``expert_episodes``) come back in seed order; the eval's (sim/eval.py's ``run_parallel``) meet
--episode-timeout."""

from __future__ import annotations

import itertools
import multiprocessing as mp
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest

from dit4dit_npu.sim import demos
from dit4dit_npu.sim.demos import expert_episodes
from dit4dit_npu.sim.errors import SimError
from dit4dit_npu.sim.eval import run_parallel
from dit4dit_npu.sim.tasks import TRAIN_SEED0
from dit4dit_npu.sim.workers import receive, work

REPO = Path(__file__).resolve().parents[1]


def test_a_result_is_its_payload_and_an_error_is_a_sim_error() -> None:
    q = mp.get_context("spawn").Queue()
    q.put(("result", {"seed": 3}))
    q.put(("error", "--task: unknown task 'x'"))
    q.put(("crash", "Traceback ...\nValueError: boom"))
    assert receive(q, [], "a demo worker") == {"seed": 3}
    with pytest.raises(SimError, match=r"^--task: unknown task 'x'$"):
        receive(q, [], "a demo worker")
    with pytest.raises(RuntimeError, match=r"^a demo worker failed:\nTraceback"):
        receive(q, [], "a demo worker")


def test_a_worker_that_dies_without_a_word_ends_the_wait() -> None:
    ctx = mp.get_context("spawn")
    q, p = ctx.Queue(), ctx.Process(target=os._exit, args=(3,))
    p.start()
    p.join(timeout=60)
    with pytest.raises(RuntimeError, match="a demo worker: a worker died with exit code 3"):
        receive(q, [p], "a demo worker")


def test_a_silent_worker_meets_the_deadline() -> None:
    ctx = mp.get_context("spawn")
    q, p = ctx.Queue(), ctx.Process(target=time.sleep, args=(60,), daemon=True)
    p.start()
    try:
        t0 = time.monotonic()
        with pytest.raises(SimError, match=r"^a demo worker: no answer within 1 s$"):
            receive(q, [p], "a demo worker", deadline_s=1.0)
        assert time.monotonic() - t0 < 10
    finally:
        p.terminate()


# Stand-in demo workers (sim/demos.py's protocol, no scene): the order, deadline and clean-up of
# expert_episodes without MuJoCo's cost. Module-level, so that spawned processes can import them.
def _stand_in(first_seed: Callable[[], None], seeds, results) -> None:
    """Answers each seed at once with a tiny episode; on the first seed it calls ``first_seed``."""

    def run(seed: int):
        if seed == TRAIN_SEED0:
            first_seed()
        return seed, {"seed": seed}, 1

    work(lambda: (None, run, lambda: None), seeds, results)


def _first_seed_late(task, size_hw, horizon, seeds, results) -> None:
    _stand_in(lambda: time.sleep(1.5), seeds, results)  # the others come back first


def _first_seed_hangs(task, size_hw, horizon, seeds, results) -> None:
    _stand_in(lambda: time.sleep(3600), seeds, results)


def _first_seed_kills_its_worker(task, size_hw, horizon, seeds, results) -> None:
    _stand_in(lambda: os._exit(9), seeds, results)


def test_episodes_come_in_seed_order_whichever_worker_finishes_first() -> None:
    with expert_episodes("transfer_cube", (8, 8), 10, TRAIN_SEED0, 2, worker=_first_seed_late) as stream:
        got = [(seed, ep["seed"]) for seed, ep, _ in itertools.islice(stream, 6)]
    assert got == [(TRAIN_SEED0 + i, TRAIN_SEED0 + i) for i in range(6)]


def test_a_hung_worker_is_an_error_while_the_others_answer(monkeypatch) -> None:
    monkeypatch.setattr(demos, "EPISODE_DEADLINE_S", 2.0)
    t0 = time.monotonic()
    with pytest.raises(SimError, match=rf"^simulating seed {TRAIN_SEED0}: no answer within 2 s$"):
        with expert_episodes("transfer_cube", (8, 8), 10, TRAIN_SEED0, 2, worker=_first_seed_hangs) as stream:
            next(stream)
    assert time.monotonic() - t0 < 30


def test_a_killed_worker_is_an_error_while_the_others_answer() -> None:
    with pytest.raises(RuntimeError, match=rf"^simulating seed {TRAIN_SEED0}: a worker died with exit code 9"):
        with expert_episodes("transfer_cube", (8, 8), 10, TRAIN_SEED0, 2, worker=_first_seed_kills_its_worker) as s:
            next(s)


def _eval_seed_0_hangs(setup, seeds, results) -> None:
    """A stand-in eval worker (sim/rollout.py's protocol, no scene or policy)."""

    def run(seed: int):
        if seed == 0:
            time.sleep(3600)
        return {"seed": seed}

    work(lambda: ({"stand_in": True}, run, lambda: None), seeds, results)


def test_an_eval_worker_silent_past_the_episode_timeout_ends_the_eval(tmp_path: Path) -> None:
    got: list[dict] = []
    t0 = time.monotonic()
    with pytest.raises(SimError, match=r"^an eval worker's next episode: no answer within 2 s \(--episode-timeout\)$"):
        run_parallel(SimpleNamespace(video_dir=None), [0, 1, 2, 3], 2, tmp_path / "out", got.append, timeout_s=2.0,
                     worker=_eval_seed_0_hangs)
    assert time.monotonic() - t0 < 30
    assert sorted(r["seed"] for r in got) == [1, 2, 3]  # the other worker's episodes came back
    assert not mp.active_children()  # the hung worker was stopped


def test_workers_end_when_their_parent_is_killed(tmp_path: Path) -> None:
    """SIGKILL gives the parent no chance to stop its workers: they see it gone and exit."""
    parent = subprocess.Popen(
        [sys.executable, "-c", (
            "import multiprocessing as mp, time\n"
            "import test_sim_workers as t\n"
            "from dit4dit_npu.sim.demos import expert_episodes\n"
            "with expert_episodes('transfer_cube', (8, 8), 10, 100000, 2, worker=t._first_seed_hangs) as s:\n"
            "    print(' '.join(str(p.pid) for p in mp.active_children()), flush=True)\n"
            "    time.sleep(600)\n"
        )],
        cwd=REPO, env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])},
        stdout=subprocess.PIPE, text=True,
    )
    try:
        pids = [int(p) for p in parent.stdout.readline().split()]
        assert len(pids) == 2, pids
    finally:
        parent.kill()
        parent.wait(timeout=60)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(_running(p) for p in pids):
        time.sleep(0.5)
    assert not any(_running(p) for p in pids), pids


def _running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's exit is reaped by whoever adopted it, if anyone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False
