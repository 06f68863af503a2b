"""Server sessions for real-time chunking, over real websockets with the real tiny policy and the
robot-side client package: a connection's RTC request equals the policy's own RTC call on the chunk
that connection was sent, connections never see each other's chunk, a closed connection's session
is dropped, RTC requests batch with each other, and bad RTC fields are one line."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
from dit4dit_client import ServerError
from serve_fixtures import (
    TIMEOUT,
    RunningServer,
    in_training_range,
    load_policy,
    own_chunk_action,
    sample_observations,
)

from dit4dit_npu.policy import DiT4DiTPolicy, PrevChunkRangeWarning


@pytest.fixture(scope="module")
def policy() -> DiT4DiTPolicy:
    return load_policy()


@pytest.fixture(scope="module")
def observations(policy: DiT4DiTPolicy) -> list[dict[str, Any]]:
    return sample_observations(policy, 4)


@pytest.fixture(scope="module")
def server(policy: DiT4DiTPolicy):
    with RunningServer(policy) as s:
        yield s


def test_rtc_on_the_session_chunk_equals_the_policys_rtc_call(server, policy, observations) -> None:
    obs = observations[0]
    with server.client() as client:
        first = client.infer({**obs, "seed": 1})
        assert first["chunk_id"] == 1 and "rtc" not in first
        out = client.infer({**obs, "seed": 2}, rtc={"executed": 3, "inference_delay": 2, "chunk_id": 1})
    assert out["chunk_id"] == 2 and out["rtc"] == {"inference_delay": 2, "executed": 3, "prefix_steps": 5}
    expected = own_chunk_action(policy, obs, 2, first["actions"][3:], inference_delay=2)
    np.testing.assert_array_equal(out["actions"], expected)
    assert not np.array_equal(out["actions"], policy.predict_action(obs, seed=2))  # it did guide


def test_explicit_prev_chunk_needs_no_session(server, policy, observations) -> None:
    obs = observations[1]
    prev = in_training_range(policy, policy.predict_action(obs, seed=5)[2:])  # as a robot sends it
    with server.client() as client:
        out = client.infer({**obs, "seed": 6}, rtc={"prev_chunk": prev, "inference_delay": 1})
    np.testing.assert_array_equal(out["actions"], policy.predict_action(obs, seed=6, prev_chunk=prev, inference_delay=1))


def test_two_clients_do_not_see_each_others_chunk(server, policy, observations) -> None:
    a_obs, b_obs = observations[0], observations[2]
    with server.client() as a, server.client() as b:
        a_chunk = a.infer({**a_obs, "seed": 11})["actions"]
        with pytest.raises(ServerError, match="this connection has no previous chunk"):
            b.infer({**b_obs, "seed": 12}, rtc={"executed": 1, "inference_delay": 1})
        b_chunk = b.infer({**b_obs, "seed": 13})["actions"]
        a_out = a.infer({**a_obs, "seed": 14}, rtc={"executed": 4, "inference_delay": 2})["actions"]
        b_out = b.infer({**b_obs, "seed": 14}, rtc={"executed": 4, "inference_delay": 2})["actions"]
    np.testing.assert_array_equal(
        a_out, own_chunk_action(policy, a_obs, 14, a_chunk[4:], inference_delay=2)
    )
    np.testing.assert_array_equal(
        b_out, own_chunk_action(policy, b_obs, 14, b_chunk[4:], inference_delay=2)
    )


def _wait_for(condition, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def test_a_closed_connection_drops_its_session(policy, observations) -> None:
    with RunningServer(policy) as server:
        client = server.client()
        client.infer({**observations[0], "seed": 1})
        _wait_for(lambda: len(server.server.sessions) == 1, "the session")
        (session,) = server.server.sessions
        assert session.chunk is not None and session.chunk_id == 1
        client.close()
        _wait_for(lambda: not server.server.sessions, "the closed connection's session to go")
        assert session.chunk is None and not session.latencies_s  # its state was freed


def test_episode_start_clears_the_session(server, observations) -> None:
    with server.client() as client:
        client.infer(observations[0])
        client.reset()  # openpi's episode_start
        with pytest.raises(ServerError, match="no previous chunk"):
            client.infer(observations[0], rtc={"executed": 1, "inference_delay": 0})


@pytest.mark.slow  # over 4 s of one core: the full tier (the fast tier keeps to 3 minutes)
def test_rtc_requests_batch_with_each_other(policy, observations) -> None:
    # A server of its own with a long batching window: the window closes as soon as every open
    # connection has a request queued, so the test does not wait for it, and a loaded machine
    # (threads released by the barrier but scheduled late) cannot split the batch.
    with RunningServer(policy, batch_window_ms=5000) as server:
        _rtc_requests_batch(server, policy, observations)


def _rtc_requests_batch(server, policy, observations) -> None:
    clients = [server.client() for _ in observations]
    try:
        chunks = [c.infer({**o, "seed": 3})["actions"] for c, o in zip(clients, observations)]
        start = threading.Barrier(len(clients))

        def rtc(i: int) -> dict[str, Any]:
            start.wait(TIMEOUT)
            return clients[i].infer({**observations[i], "seed": 4}, rtc={"executed": 2 + i % 2, "inference_delay": 1 + i})

        with ThreadPoolExecutor(len(clients)) as pool:
            replies = list(pool.map(rtc, range(len(clients)), timeout=TIMEOUT))
    finally:
        for c in clients:
            c.close()
    assert {r["server_timing"]["batch_size"] for r in replies} == {len(clients)}
    for i, (obs, chunk, r) in enumerate(zip(observations, chunks, replies)):
        single = own_chunk_action(policy, obs, 4, chunk[2 + i % 2 :], inference_delay=1 + i)
        np.testing.assert_allclose(r["actions"], single, rtol=1e-5, atol=1e-5)


def test_the_delay_is_estimated_from_the_control_rate(server, observations) -> None:
    with server.client() as client:
        first = client.infer(observations[0])
        with pytest.raises(ServerError, match="rtc.inference_delay: not given"):
            client.infer(observations[0], rtc={"executed": 1})
        latency_s = (first["server_timing"]["queue_ms"] + first["server_timing"]["infer_ms"]) / 1e3
        out = client.infer(observations[0], rtc={"executed": 1, "control_hz": 1000.0})
        assert 1 <= out["rtc"]["inference_delay"] <= min(7, int(np.ceil(latency_s * 1000)))
        # a refused request's rate is not remembered: the next estimate still uses 1000 Hz, not 0.001
        with pytest.raises(ServerError, match="rtc.executed: expected an int"):
            client.infer(observations[0], rtc={"executed": 99, "control_hz": 0.001})
        out = client.infer(observations[0], rtc={"executed": 1})
        floor = min(out["rtc"]["prefix_steps"], int(np.ceil(latency_s * 1000)))
        assert floor > 1 and out["rtc"]["inference_delay"] >= floor  # at 0.001 Hz it would be 1


def test_bad_rtc_fields_are_one_line_and_the_connection_lives_on(server, policy, observations) -> None:
    obs = observations[0]
    h, a = policy.chunk_length, policy.action_dim
    cases = [
        ({"prev_chunk": np.zeros((3, a - 1), np.float32), "inference_delay": 1}, r"rtc.prev_chunk: expected shape \(L, 14\)"),
        ({"prev_chunk": np.full((3, a), np.nan, np.float32), "inference_delay": 1}, "rtc.prev_chunk: contains NaN or inf"),
        ({"prev_chunk": np.zeros((3, a), np.float32), "inference_delay": h + 1}, f"rtc.inference_delay {h + 1} exceeds"),
        ({"executed": 2, "inference_delay": h}, f"rtc.inference_delay {h} exceeds the {h - 2} steps"),
        ({"executed": h}, f"rtc.executed: expected an int 0 to {h - 1}"),
        ({"executed": 1, "inference_delay": 1, "chunk_id": 99}, "rtc.chunk_id: 99 is not this connection's last chunk"),
        ({"executed": 1, "prev_chunk": np.zeros((3, a), np.float32)}, "rtc: give exactly one of executed"),
        ({"executed": 1, "delay": 2}, r"rtc: unknown key\(s\) \['delay'\]"),
        ({"executed": 1, "control_hz": -5}, "rtc.control_hz: expected the robot's control rate in Hz, > 0 and at most 1000"),
        ("yes", "rtc: expected a dict"),
    ]
    with server.client() as client:
        first = client.infer({**obs, "seed": 1})
        for rtc, match in cases:
            with pytest.raises(ServerError, match=match) as e:
                client.infer({**obs, "seed": 1}, rtc=rtc)
            assert "\n" not in str(e.value)
        # refused requests never replaced the chunk: executed still counts from the first one
        out = client.infer({**obs, "seed": 2}, rtc={"executed": 1, "inference_delay": 1, "chunk_id": 1})
    np.testing.assert_array_equal(
        out["actions"], own_chunk_action(policy, obs, 2, first["actions"][1:], inference_delay=1)
    )


def test_prev_chunk_in_degrees_is_refused_by_the_server_unless_it_allows_out_of_range(policy, observations) -> None:
    obs = observations[0]
    degrees = np.degrees(in_training_range(policy, policy.predict_action(obs, seed=1))[2:])
    rtc = {"prev_chunk": degrees, "inference_delay": 1}
    with RunningServer(policy) as srv, srv.client() as client:
        with pytest.raises(ServerError) as e:
            client.infer({**obs, "seed": 2}, rtc=rtc)
        line = str(e.value)
        assert "\n" not in line and line.startswith("rtc.prev_chunk far outside the training range")
        assert " (trained on [" in line and "--allow-out-of-range answers it" in line
        with pytest.raises(ServerError, match=r"rtc.max_guidance_weight: expected a number in \[0, 100\]"):
            client.infer({**obs, "seed": 2}, rtc={"prev_chunk": degrees / 57.3, "inference_delay": 1,
                                                  "max_guidance_weight": 1e30})
        assert client.infer({**obs, "seed": 3})["chunk_id"] >= 1  # the connection lives on
    with RunningServer(policy, allow_out_of_range=True) as srv, srv.client() as client:
        out = client.infer({**obs, "seed": 2}, rtc=rtc)
        assert len(out["warnings"]) == 1 and out["warnings"][0].startswith("prev_chunk far outside the training range")
        assert client.get_server_metadata()["out_of_range_state"] == "answered with warnings"
    with pytest.warns(PrevChunkRangeWarning):
        expected = policy.predict_action(obs, seed=2, prev_chunk=degrees, inference_delay=1, allow_out_of_range=True)
    np.testing.assert_array_equal(out["actions"], expected)  # the same call the policy makes
