"""Policy server soak: 8 robots for 10 minutes against one server process, on loopback.

    python bench/serve_soak.py [--policy POLICY_DIR] [--clients 8] [--duration 600]
                               [--server-threads 1] [--sample-every 30]
    python bench/serve_soak.py --smoke   # seconds: checks that the bench works; its numbers mean nothing

Starts one real ``python -m dit4dit_npu.serve`` process (default flags: batching on; bound to
127.0.0.1) on the policy (without ``--policy``: the tiny one, untrained, built as
``bench/serve_load.py`` builds it), then ``--clients`` threads, each a real ``dit4dit_client``
websocket connection sending its own random observations one after another, as a robot does,
until ``--duration`` seconds have passed (each request bounded by the client's reply deadline).
A request that fails (an error reply, a dropped connection, a missed deadline) is counted and its
client reconnects. Reported: requests served, errors (target 0), throughput, p50 / p99 latency
per request as the clients see it, and the server's resident memory (VmRSS) after the warm-up
(every client's first requests: connections, allocator, caches) and at the end, sampled every
``--sample-every`` seconds between. The last line is the headline, ``rss_growth: X.XX%`` (end vs
after warm-up; target <= 5%): no speedup applies to a soak.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
import time
from pathlib import Path

import numpy as np
from _serving import WARMUP, observation, policy_or_tiny, served
from dit4dit_client import WebsocketClientPolicy

from dit4dit_npu.console import run

REPLY_DEADLINE_S = 60.0  # one request: far above the tiny policy's worst latency on a loaded CPU


def rss_mib(pid: int) -> float:
    """Resident memory of process ``pid`` (Linux /proc), MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise SystemExit(f"no VmRSS for process {pid}")


class Robot:
    """One client: requests until ``stop`` is set; latencies and errors of its own."""

    def __init__(self, uri: str, meta: dict, seed: int) -> None:
        self.uri, self.meta, self.rng = uri, meta, np.random.default_rng(seed)
        self.latencies_ms: list[float] = []
        self.errors: list[str] = []
        self.conn = self._connect()

    def _connect(self) -> WebsocketClientPolicy:
        return WebsocketClientPolicy(self.uri, None, connect_timeout_s=60, request_timeout_s=REPLY_DEADLINE_S)

    def warm_up(self) -> None:
        for _ in range(WARMUP):
            self.conn.infer(observation(self.meta, self.rng))

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            obs = observation(self.meta, self.rng)
            t0 = time.perf_counter()
            try:
                self.conn.infer(obs)
            except Exception as e:  # counted, and the robot carries on on a new connection
                self.errors.append(f"{type(e).__name__}: {e}")
                with contextlib.suppress(Exception):
                    self.conn.close()
                self.conn = self._connect()
                continue
            self.latencies_ms.append((time.perf_counter() - t0) * 1e3)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.close()


def soak(uri: str, pid: int, clients: int, duration: float, sample_every: float) -> dict:
    with WebsocketClientPolicy(uri, None) as probe:  # observations of the right shapes
        meta = probe.get_server_metadata()
    robots = [Robot(uri, meta, seed) for seed in range(clients)]
    try:
        for r in robots:
            r.warm_up()
        samples = [(0.0, rss_mib(pid))]
        stop = threading.Event()
        threads = [threading.Thread(target=r.run, args=(stop,), daemon=True) for r in robots]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        while (elapsed := time.monotonic() - t0) < duration:
            time.sleep(min(sample_every, duration - elapsed))
            samples.append((time.monotonic() - t0, rss_mib(pid)))
            print(f"  {samples[-1][0]:7.1f} s: server rss {samples[-1][1]:8.1f} MiB, "
                  f"{sum(len(r.latencies_ms) for r in robots)} requests served", flush=True)
        stop.set()
        for t in threads:
            t.join(REPLY_DEADLINE_S + 5)  # at most one request in flight each
        seconds = time.monotonic() - t0
        samples.append((seconds, rss_mib(pid)))
    finally:
        for r in robots:
            r.close()
    return {"robots": robots, "seconds": seconds, "samples": samples}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--policy", type=Path, default=None, help="policy folder (default: build the tiny one)")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--duration", type=float, default=600.0, help="seconds of load after the warm-up")
    p.add_argument("--server-threads", type=int, default=1, help="OMP_NUM_THREADS of the server process")
    p.add_argument("--sample-every", type=float, default=30.0, help="seconds between resident-memory samples")
    p.add_argument("--smoke", action="store_true",
                   help="a seconds-long run (overrides --duration): checks that the bench works; its numbers mean nothing")
    args = p.parse_args(argv)
    if args.smoke:
        args.duration, args.sample_every = 4.0, 2.0
    if args.clients < 1 or not args.duration > 0 or not args.sample_every > 0:
        raise SystemExit("--clients, --duration and --sample-every must be > 0")
    # A TERM (e.g. from `timeout`) unwinds normally, so the server process is stopped too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    with contextlib.ExitStack() as stack:
        policy = policy_or_tiny(stack, args.policy, "serve_soak")
        server = stack.enter_context(served(policy, "soak", ["--host", "127.0.0.1"], args.server_threads))
        started = rss_mib(server.pid)
        print(f"server up (pid {server.pid}, rss {started:.1f} MiB); {args.clients} clients for {args.duration:g} s, "
              f"server threads {args.server_threads}; {os.cpu_count()} CPUs visible", flush=True)
        result = soak(server.uri, server.pid, args.clients, args.duration, args.sample_every)

    robots, seconds, samples = result["robots"], result["seconds"], result["samples"]
    latencies = [x for r in robots for x in r.latencies_ms]
    errors = [e for r in robots for e in r.errors]
    warm, end = samples[0][1], samples[-1][1]
    print(f"\nrequests served: {len(latencies)} in {seconds:.1f} s ({len(latencies) / seconds:.1f}/s), "
          f"{args.clients} clients")
    if latencies:
        print(f"latency: p50 {np.percentile(latencies, 50):.1f} ms, p99 {np.percentile(latencies, 99):.1f} ms, "
              f"max {max(latencies):.1f} ms")
    print(f"errors: {len(errors)}" + (f" (first: {errors[0]})" if errors else ""))
    print(f"server rss: {started:.1f} MiB at start, {warm:.1f} MiB after the warm-up, {end:.1f} MiB at the end, "
          f"max {max(m for _, m in samples):.1f} MiB")
    print(f"rss_growth: {100 * (end - warm) / warm:.2f}%")


if __name__ == "__main__":
    raise SystemExit(run(main))  # user errors: one line, exit code 2 (dit4dit_npu.console)
