"""The one way a simulation command and its spawned worker processes (demos, eval) talk and wait.

A worker (``work``) puts ``(kind, payload)`` on its result queue: ``("ready", info)`` once, then
``("result", ...)`` per task; or, once and last, ``("error", line)`` for a bad input it found (a
``SimError``) or ``("crash", traceback)``. The command reads them with ``receive``.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import time
import traceback
from collections.abc import Callable
from typing import Any

from dit4dit_npu.sim.errors import SimError


def receive(
    result_q, procs, what: str, deadline_s: float | None = None, since: float | None = None, key: str | None = None
) -> Any:
    """The next message's payload. A worker's error is raised here as a ``SimError``, its crash as a
    RuntimeError with its traceback. A dead worker (a crash in native code, the OOM killer) is an
    error as soon as it is seen, and with ``deadline_s`` so is no message within it of ``since``
    (``time.monotonic()``; default: now): never a wait forever. ``key``: the flag that sets the
    deadline, named in that error."""
    start = time.monotonic() if since is None else since
    while True:
        dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
        if dead:
            raise RuntimeError(f"{what}: a worker died with exit code {dead[0]} (see its output above)")
        if deadline_s is not None and time.monotonic() - start > deadline_s:
            raise SimError(f"{what}: no answer within {deadline_s:g} s" + (f" ({key})" if key else ""))
        try:
            kind, payload = result_q.get(timeout=2.0)
            break
        except queue.Empty:
            continue
    if kind == "error":
        raise SimError(payload)
    if kind == "crash":
        raise RuntimeError(f"{what} failed:\n{payload}")
    return payload


def stop(procs) -> None:
    """End every worker still running: SIGTERM, up to 10 s each to go, then SIGKILL for one stuck
    where SIGTERM cannot reach (a native call). What they had not sent is dropped with them."""
    procs = [p for p in procs if p.pid is not None]  # (one never started has nothing to end)
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(timeout=10)
        if p.is_alive():
            p.kill()
            p.join(timeout=10)


def next_task(tasks, results) -> Any:
    """In a worker: the next task its parent sent, or None once the parent is gone, so that a parent
    killed before it could stop its workers (SIGTERM, SIGKILL) leaves no orphans behind. What this
    worker has not yet sent is dropped (the queue's flush would wait on a reader that is gone)."""
    parent = mp.parent_process()
    while True:
        try:
            return tasks.get(timeout=1.0)
        except queue.Empty:
            if parent is not None and not parent.is_alive():
                results.cancel_join_thread()
                return None


def work(start: Callable[[], tuple[Any, Callable[[Any], Any], Callable[[], None]]], tasks, results) -> None:
    """A worker's whole life. ``start()`` builds what it needs (a scene, a policy) and returns
    ``(info, run, close)``; then ``("ready", info)``, and ``("result", run(task))`` for each task
    until a None or its parent is gone; ``close()`` at the end, whatever ended it."""
    try:
        info, run, close = start()
    except SimError as e:
        results.put(("error", str(e)))
        return
    except Exception:
        results.put(("crash", traceback.format_exc()))
        return
    try:
        results.put(("ready", info))
        while (task := next_task(tasks, results)) is not None:
            results.put(("result", run(task)))
    except SimError as e:
        results.put(("error", str(e)))
    except Exception:
        results.put(("crash", traceback.format_exc()))
    finally:
        close()
