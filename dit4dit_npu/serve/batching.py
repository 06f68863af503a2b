"""Micro-batching: requests that arrive close together share one model call.

A model call costs almost the same for 1 row as for 8 (the tiny model on CPU: ~45 ms vs ~95 ms;
an accelerator is far flatter still), so a fleet of robots is served much faster by batching
than one request at a time. The rules:

- The first queued request opens a window of ``window_s``; requests arriving in it join, up to
  ``max_batch`` rows. The window closes early when every open connection already has a request
  waiting (a robot waits for its reply before it sends again, so nobody else can join): a lone
  client never pays the window.
- Only requests with the same key batch together. The key is (handler, seed), the handler of
  the request's kind (``handlers.py``: observations, DiT4DiT examples): a seeded call uses
  one noise draw for every row of its batch, so rows of the same seed get exactly what their
  single calls return (to float tolerance), and rows of different seeds are run as separate
  calls. Unseeded requests batch freely (each gets fresh noise either way).
- Requests are validated alone before they are queued, so a bad request is refused without
  touching anyone's batch; if a batched call still raises, every request of that batch is
  retried alone and gets its own answer, so one request can never fail the others.
- Model calls run on one worker thread (the model is not re-entrant and one device computes one
  call at a time); the event loop keeps receiving, validating and queueing meanwhile.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger("dit4dit_npu.serve")

# run(key, payloads) -> one result per payload, in order (called on the worker thread)
RunBatch = Callable[[Hashable, Sequence[Any]], Sequence[Any]]


@dataclass(frozen=True)
class Timing:
    queue_ms: float  # from submission to the start of its model call
    infer_ms: float  # the model call it was part of
    batch_size: int  # requests in that call

    def as_dict(self) -> dict[str, float]:
        return {"infer_ms": self.infer_ms, "queue_ms": self.queue_ms, "batch_size": self.batch_size}


@dataclass
class _Job:
    key: Hashable
    payload: Any
    rows: int
    future: asyncio.Future
    submitted: float = field(default_factory=time.perf_counter)


class Batcher:
    def __init__(
        self,
        run: RunBatch,
        executor: concurrent.futures.Executor,
        *,
        max_batch: int,
        window_s: float,
        open_connections: Callable[[], int] = lambda: 0,
    ) -> None:
        if max_batch < 1 or window_s < 0:
            raise ValueError(f"max_batch must be >= 1 and the window >= 0, got {max_batch}, {window_s}")
        self._run = run
        self._executor = executor
        self.max_batch = max_batch
        self.window_s = window_s
        self._open_connections = open_connections
        self._queue: asyncio.Queue[_Job] | None = None
        self._task: asyncio.Task | None = None

    async def submit(self, key: Hashable, payload: Any, rows: int) -> tuple[Any, Timing]:
        """Queue one validated request; its result (or its own exception) once computed."""
        if self._task is None:  # created lazily: the queue must belong to the running loop
            self._queue = asyncio.Queue()
            self._task = asyncio.get_running_loop().create_task(self._serve())
        assert self._queue is not None
        job = _Job(key, payload, rows, asyncio.get_running_loop().create_future())
        self._queue.put_nowait(job)
        return await job.future

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    async def _serve(self) -> None:
        carry: _Job | None = None
        while True:
            jobs, carry = await self._collect(carry)
            groups: dict[Hashable, list[_Job]] = {}
            for job in jobs:  # arrival order within each key
                groups.setdefault(job.key, []).append(job)
            for group in groups.values():
                await self._execute(group)

    async def _collect(self, carry: _Job | None) -> tuple[list[_Job], _Job | None]:
        """The next batch: ``carry`` (left over from the last round) or the next request, plus
        whatever arrives within the window, up to ``max_batch`` rows."""
        assert self._queue is not None
        jobs = [carry if carry is not None else await self._queue.get()]
        rows = jobs[0].rows
        deadline = time.perf_counter() + self.window_s
        while rows < self.max_batch:
            if self._queue.empty():
                if len(jobs) >= self._open_connections():
                    break  # every connection is waiting on this batch: nobody else can join
                remaining = deadline - time.perf_counter()
                if remaining <= 0:
                    break
                try:
                    job = await asyncio.wait_for(self._queue.get(), remaining)
                except asyncio.TimeoutError:
                    break
            else:
                job = self._queue.get_nowait()
            if rows + job.rows > self.max_batch:
                return jobs, job
            jobs.append(job)
            rows += job.rows
        return jobs, None

    async def _execute(self, group: list[_Job]) -> None:
        started = time.perf_counter()
        loop = asyncio.get_running_loop()
        try:
            outcomes, size = await loop.run_in_executor(self._executor, self._call, group)
        except Exception as e:  # the executor itself failed (shut down): nobody may hang
            outcomes, size = [e] * len(group), 1
        infer_ms = (time.perf_counter() - started) * 1e3
        for job, outcome in zip(group, outcomes, strict=True):
            if job.future.done():  # the client went away
                continue
            if isinstance(outcome, BaseException):
                job.future.set_exception(outcome)
            else:
                job.future.set_result((outcome, Timing((started - job.submitted) * 1e3, infer_ms, size)))

    def _call(self, group: list[_Job]) -> tuple[list[Any], int]:
        """On the worker thread: one batched call; if it raises, each request alone.
        -> (one result or exception per request, requests per model call)."""
        key = group[0].key
        if len(group) > 1:
            try:
                results = list(self._run(key, [j.payload for j in group]))
                if len(results) == len(group):
                    return results, len(group)
                raise RuntimeError(f"batched call returned {len(results)} results for {len(group)} requests")
            except Exception as e:
                logger.warning("batched call of %d requests failed (%s: %s); answering each alone",
                               len(group), type(e).__name__, e)
        outcomes: list[Any] = []
        for job in group:
            try:
                outcomes.append(self._run(key, [job.payload])[0])
            except Exception as e:
                outcomes.append(e)
        return outcomes, 1
