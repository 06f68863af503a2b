"""Robot-side chunk execution (client/dit4dit_client/chunking.py, runtime.py): what each merging mode
executes at each control step when chunks arrive late, the delay fed back, and the real-time loop
against the real server with an RTC session."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from dit4dit_client import AsyncChunkRunner, ChunkExecutor, delay_steps, websocket_infer
from serve_fixtures import RunningServer, load_policy, sample_observations

H = 8


def plan(step: int) -> np.ndarray:
    """A chunk whose action i says (observation step, i): what was executed is readable."""
    return np.array([[step, i] for i in range(H)], np.float32)


def drive(ex: ChunkExecutor, steps: int, delay: int) -> tuple[list, list]:
    """The simulated loop: a request's chunk arrives ``delay`` steps after its observation."""
    executed, requests, in_flight = [], [], None
    for k in range(steps):
        if in_flight is not None and k >= in_flight.step + delay:
            ex.receive(plan(in_flight.step), k)
            in_flight = None
        if ex.wants_request(k):
            in_flight = ex.request(k)
            requests.append(in_flight)
            if delay == 0:
                ex.receive(plan(k), k)
                in_flight = None
        a = ex.action(k)
        executed.append(None if a is None else tuple(a.tolist()))
    return executed, requests


def test_sync_holds_while_computing_then_starts_the_chunk_from_its_first_action():
    executed, _ = drive(ChunkExecutor("sync", execution_horizon=4), 14, delay=2)
    assert executed[:2] == [None, None]  # waiting for the first chunk
    assert executed[2:6] == [(0, 0), (0, 1), (0, 2), (0, 3)]
    assert executed[6:8] == [None, None]  # paused during the next request (observation at 6)
    assert executed[8:12] == [(6, 0), (6, 1), (6, 2), (6, 3)]


def test_async_switches_at_the_delay_index_and_rtc_sends_the_rest_and_the_measured_delay():
    for mode in ("async", "rtc"):
        ex = ChunkExecutor(mode, execution_horizon=4)
        executed, requests = drive(ex, 14, delay=2)
        # chunk 0 (observed at 0) arrives at 2; next request at 4 (4 executed), arrives at 6 -> its action 2
        assert executed[2:6] == [(0, 2), (0, 3), (0, 4), (0, 5)]
        assert executed[6:10] == [(4, 2), (4, 3), (4, 4), (4, 5)]
        assert ex.boundaries[:3] == [2, 6, 10] and list(ex.delays) == [2, 2, 2]
        second = requests[1]
        assert second.step == 4 and second.executed == 4  # chunk 0 is placed at its observation, step 0
        if mode == "async":
            assert second.rtc() is None
        else:
            np.testing.assert_array_equal(second.prev_chunk, plan(0)[4:])
            assert second.inference_delay == 2  # the delay measured on the first request, fed back
            assert second.rtc(session=True) == {"executed": 4, "inference_delay": 2}


def test_rtc_request_counts_executed_from_the_chunks_observation():
    ex = ChunkExecutor("rtc", execution_horizon=3, initial_delay=1)
    ex.request(0)
    ex.receive(plan(0), 2)  # measured delay 2
    assert not ex.wants_request(2) and ex.wants_request(3)
    req = ex.request(3)
    assert req.executed == 3 and req.inference_delay == 2
    np.testing.assert_array_equal(req.prev_chunk, plan(0)[3:])
    assert req.rtc(session=True) == {"executed": 3, "inference_delay": 2}
    assert set(req.rtc()) == {"prev_chunk", "inference_delay"}


def test_temporal_ensembling_averages_every_chunk_covering_a_step():
    ex = ChunkExecutor("ensemble", execution_horizon=2, ensemble_decay=0.5)
    ex.request(0)
    ex.receive(plan(0), 0)
    ex.request(2)
    ex.receive(plan(2) + 100, 2)
    w = np.exp(-0.5 * np.arange(2))
    w /= w.sum()
    expected = w[0] * plan(0)[3] + w[1] * (plan(2)[1] + 100)  # step 3: chunk 0's action 3, chunk 1's action 1
    np.testing.assert_allclose(ex.action(3), expected, rtol=1e-6)
    assert ex.action(9) is not None and ex.action(10) is None  # chunk 1 covers steps 2-9


def test_whole_chunks_of_any_length_by_default():
    ex = ChunkExecutor("sync")
    ex.request(0)
    ex.receive(np.zeros((3, 2)), 0)
    assert not ex.wants_request(2) and ex.wants_request(3)


def test_a_chunk_that_runs_out_before_the_next_arrives_holds():
    executed, _ = drive(ChunkExecutor("async", execution_horizon=6), 16, delay=4)
    # chunk 0 arrives at 4 and covers 0-7; the request at 6 arrives at 10: steps 8, 9 have nothing
    assert executed[8:10] == [None, None] and executed[10] == (6, 4)


def test_bad_settings_are_one_line():
    with pytest.raises(ValueError, match="mode: expected one of"):
        ChunkExecutor("sometimes", 4)
    with pytest.raises(ValueError, match="execution_horizon: expected >= 1"):
        ChunkExecutor("rtc", 0)
    ex = ChunkExecutor("rtc", 4)
    ex.request(0)
    with pytest.raises(ValueError, match="chunk: 2 NaN/inf value"):
        ex.receive(np.where(np.eye(H, 2) > 0, np.nan, 0.0), 1)
    with pytest.raises(ValueError, match=r"chunk: expected \(steps, action_dim\)"):
        ex.receive(np.zeros(H), 1)
    assert delay_steps(0.1, 50) == 5 and delay_steps(0.0, 50) == 0 and delay_steps(0.101, 50) == 6


@pytest.mark.slow
def test_the_real_time_loop_runs_rtc_against_the_server():
    policy = load_policy()
    obs = sample_observations(policy, 1)[0]
    sent: list[np.ndarray] = []
    observed = threading.Event()

    def get_observation():
        observed.set()
        return dict(obs)

    with RunningServer(policy) as server, server.client() as client:
        requests = []
        send = websocket_infer(client, session=True)

        def infer(o, req):
            requests.append(req)
            return send(o, req)

        ex = ChunkExecutor("rtc", execution_horizon=policy.chunk_length // 2)
        t0 = time.monotonic()
        stats = AsyncChunkRunner(infer, ex, control_hz=50, get_observation=get_observation,
                                 send_action=sent.append).run(steps=60)
        wall = time.monotonic() - t0
        (session,) = server.server.sessions
        assert session.chunk_id == len(requests)  # every request reached the server on this session
    assert observed.is_set() and stats.steps == 60 and wall >= 60 / 50 * 0.95
    assert len(requests) >= 3 and len(sent) == 60 - stats.idle and all(np.isfinite(a).all() for a in sent)
    assert all(d >= 1 for d in stats.delays)  # a model call on CPU takes at least one 20 ms tick
    assert requests[0].prev_chunk is None
    for i, req in enumerate(requests[1:], 1):
        assert req.executed >= policy.chunk_length // 2
        if req.executed >= policy.chunk_length:  # the chunk ran out (a very loaded machine): a plain request
            assert req.prev_chunk is None
            continue
        # RTC on the session, with the largest delay measured recently (capped by what is left)
        assert req.inference_delay == min(max(stats.delays[max(0, i - 5) : i]), len(req.prev_chunk))
