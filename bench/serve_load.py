"""Policy server under load: the batching server vs the one-at-a-time server, same run.

    python bench/serve_load.py [--policy POLICY_DIR] [--clients 1 8 32] [--requests 20]
                               [--max-batch 8] [--window-ms 5] [--server-threads 1]
    python bench/serve_load.py --smoke   # seconds: 1 and 2 clients, 2 requests each

Starts two real server processes (``python -m dit4dit_npu.serve``) on the same policy: the
default batching one (``--max-batch``, ``--batch-window-ms``) and ``--max-batch 1`` (one request
at a time). Then, for each client count, that many client threads connect through real
websockets (``dit4dit_client``) and each sends unseeded observations (its own random
images and state, one after another, as a robot does): ``--rounds`` bursts per server,
alternating between the two servers burst by burst so that the load of a shared machine hits
both alike, ``--requests`` timed requests per client in all. Reported per server and client
count: throughput (replies / seconds of the bursts), p50 / p95 latency per request seen by the
client, and the mean rows per model call (from the replies' ``server_timing``).

Without ``--policy`` it builds the tiny policy (``configs/robotwin/dit4dit_robotwin_tiny.yaml``,
untrained weights: only timing matters) in a temp folder, on demo data it writes there itself (the
trainer generates demo data only at its default location). The last line is ``speedup: X.XX`` =
batching / one-at-a-time throughput at 8 clients (or the nearest client count run).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from _serving import WARMUP, observation, policy_or_tiny, server_process
from dit4dit_client import WebsocketClientPolicy

from dit4dit_npu.console import run


@dataclass
class Load:
    server: str
    clients: int
    replies: int
    seconds: float
    latencies_ms: list[float]
    rows_per_call: float

    @property
    def throughput(self) -> float:
        return self.replies / self.seconds

    def pct(self, q: float) -> float:
        return float(np.percentile(self.latencies_ms, q))


def run_load(uri: str, name: str, clients: int, requests: int, meta: dict[str, Any]) -> Load:
    """``clients`` robots on ``uri``, each sending ``requests`` timed observations built from ``meta``."""
    conns = [WebsocketClientPolicy(uri, None, connect_timeout_s=60) for _ in range(clients)]
    start = threading.Barrier(clients + 1, timeout=600)

    def robot(i: int) -> tuple[list[float], list[int]]:
        try:
            rng = np.random.default_rng(i)
            obs = [observation(meta, rng) for _ in range(WARMUP + requests)]
            for o in obs[:WARMUP]:
                conns[i].infer(o)
        except BaseException:
            start.abort()  # never leave the others waiting for this robot
            raise
        start.wait()
        lat, rows = [], []
        for o in obs[WARMUP:]:
            t0 = time.perf_counter()
            out = conns[i].infer(o)
            lat.append((time.perf_counter() - t0) * 1e3)
            rows.append(out["server_timing"].get("batch_size", 1))  # older servers: 1
        return lat, rows

    try:
        with ThreadPoolExecutor(clients) as pool:
            futures = [pool.submit(robot, i) for i in range(clients)]
            try:
                start.wait()
            except threading.BrokenBarrierError:
                for f in futures:
                    f.result()  # raises the robot's own error
                raise
            t0 = time.perf_counter()
            results = [f.result() for f in futures]
            seconds = time.perf_counter() - t0
    finally:
        for c in conns:
            c.close()
    latencies = [x for lat, _ in results for x in lat]
    rows = [x for _, r in results for x in r]
    # a call of n rows is reported by each of its n replies: weight by 1/n for the per-call mean
    calls = sum(1 / r for r in rows)
    return Load(name, clients, len(latencies), seconds, latencies, len(rows) / calls)


def merge(runs: list[Load]) -> Load:
    replies = sum(r.replies for r in runs)
    calls = sum(r.replies / r.rows_per_call for r in runs)
    return Load(runs[0].server, runs[0].clients, replies, sum(r.seconds for r in runs),
                [x for r in runs for x in r.latencies_ms], replies / calls)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--policy", type=Path, default=None, help="policy folder (default: build the tiny one)")
    p.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--requests", type=int, default=24, help="timed requests per client (over all rounds)")
    p.add_argument("--rounds", type=int, default=4, help="bursts per server and client count, alternated")
    p.add_argument("--max-batch", type=int, default=8, help="the batching server's --max-batch")
    p.add_argument("--window-ms", type=float, default=5.0, help="the batching server's --batch-window-ms")
    p.add_argument("--server-threads", type=int, default=1, help="OMP_NUM_THREADS of each server process")
    p.add_argument("--baseline-repo", type=Path, default=None,
                   help="also load the server of another checkout (e.g. the previous release), default flags")
    p.add_argument("--smoke", action="store_true", help="a seconds-long run at tiny sizes (overrides the size options): checks that the bench works; its numbers mean nothing")
    args = p.parse_args(argv)
    if args.smoke:
        args.clients, args.requests, args.rounds = [1, 2], 2, 2
    # A TERM (e.g. from `timeout`) unwinds normally, so the server processes are stopped too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    with contextlib.ExitStack() as stack:
        checkpoint = policy_or_tiny(stack, args.policy, "serve_load")
        servers = {
            "batching": stack.enter_context(server_process(
                checkpoint, "batching",
                ["--max-batch", str(args.max_batch), "--batch-window-ms", str(args.window_ms)],
                args.server_threads)),
            "one-at-a-time": stack.enter_context(server_process(
                checkpoint, "single", ["--max-batch", "1"], args.server_threads)),
        }
        if args.baseline_repo is not None:
            servers["baseline"] = stack.enter_context(server_process(
                checkpoint, "baseline", [], args.server_threads, args.baseline_repo.resolve()))
        with WebsocketClientPolicy(servers["batching"], None) as probe:  # observations of the right shapes
            meta = probe.get_server_metadata()
        per_round = max(1, args.requests // args.rounds)
        print(f"batching server: --max-batch {args.max_batch} --batch-window-ms {args.window_ms}; "
              f"{per_round * args.rounds} timed requests per client in {args.rounds} alternating bursts; "
              f"server threads {args.server_threads}; {os.cpu_count()} CPUs visible")
        loads: list[Load] = []
        for n in args.clients:
            bursts: dict[str, list[Load]] = {name: [] for name in servers}
            for r in range(args.rounds):
                for name in list(servers)[:: 1 if r % 2 else -1]:  # alternate who goes first
                    bursts[name].append(run_load(servers[name], name, n, per_round, meta))
            loads.extend(merge(runs) for runs in bursts.values())
            print(f"  {n:>2} clients: done", flush=True)

    print(f"\n{'server':>14} {'clients':>8} {'replies/s':>10} {'p50 ms':>8} {'p95 ms':>8} {'rows/call':>10}")
    for r in loads:
        print(f"{r.server:>14} {r.clients:>8} {r.throughput:>10.1f} {r.pct(50):>8.1f} {r.pct(95):>8.1f} "
              f"{r.rows_per_call:>10.2f}")
    by = {(r.server, r.clients): r for r in loads}
    if 1 in args.clients:
        b, s = by["batching", 1], by["one-at-a-time", 1]
        base = f", baseline {by['baseline', 1].pct(50):.1f} ms" if ("baseline", 1) in by else ""
        print(f"single client p50: batching {b.pct(50):.1f} ms, one-at-a-time {s.pct(50):.1f} ms{base}")
    at = min(args.clients, key=lambda n: abs(n - 8))
    speedup = by["batching", at].throughput / by["one-at-a-time", at].throughput
    print(f"throughput ratio at {at} clients (batching / one-at-a-time)")
    print(f"speedup: {speedup:.2f}")


if __name__ == "__main__":
    raise SystemExit(run(main))  # user errors: one line, exit code 2 (dit4dit_npu.console)
