"""Policy server over real websockets on 127.0.0.1 with the real tiny policy (no server mocks)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import msgpack
import numpy as np
import pytest
import websockets.sync.client
from policy_fixtures import observation_from_sample, shared_tiny_setup

from dit4dit_npu.policy import DiT4DiTPolicy
from dit4dit_npu.serve import msgpack_numpy
from dit4dit_npu.serve.client import ServerError, WebsocketClientPolicy
from dit4dit_npu.serve.server import PolicyServer
from dit4dit_npu.serve.server import main as serve_main

TIMEOUT = 30.0  # every wait is bounded: a hang is a failure, not a stuck CI job


class RunningServer:
    """PolicyServer on port 0 in a background event loop."""

    def __init__(self, policy: Any, **kwargs: Any) -> None:
        self.loop = asyncio.new_event_loop()
        self.server = PolicyServer(policy, "127.0.0.1", 0, **kwargs)
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> RunningServer:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result(TIMEOUT)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(TIMEOUT)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(TIMEOUT)
        self.loop.close()

    @property
    def uri(self) -> str:
        return f"ws://127.0.0.1:{self.server.port}"

    def client(self) -> WebsocketClientPolicy:
        return WebsocketClientPolicy("127.0.0.1", self.server.port, connect_timeout_s=TIMEOUT)

    @contextlib.contextmanager
    def raw(self) -> Iterator[websockets.sync.client.ClientConnection]:
        """A bare websocket (to send what no well-behaved client would), metadata consumed."""
        with websockets.sync.client.connect(self.uri, open_timeout=TIMEOUT, max_size=None, proxy=None) as ws:
            ws.recv(timeout=TIMEOUT)
            yield ws


class SlowPolicy:
    """The real policy with an injected delay in front of every inference."""

    def __init__(self, policy: DiT4DiTPolicy, delay_s: float) -> None:
        self.policy, self.delay_s = policy, delay_s
        self.metadata = policy.metadata

    def predict_action(self, obs: dict[str, Any], seed: int | None = None) -> np.ndarray:
        time.sleep(self.delay_s)
        return self.policy.predict_action(obs, seed=seed)


@pytest.fixture(scope="module")
def policy() -> DiT4DiTPolicy:
    return DiT4DiTPolicy.from_pretrained(shared_tiny_setup().policy_dir)


@pytest.fixture(scope="module")
def observations(policy: DiT4DiTPolicy) -> list[dict[str, Any]]:
    ds = shared_tiny_setup().data.val_dataset
    step = max(1, len(ds) // 8)
    return [observation_from_sample(policy.camera_keys, ds.raw_sample(i * step)) for i in range(8)]


@pytest.fixture(scope="module")
def server(policy: DiT4DiTPolicy):
    with RunningServer(policy) as s:
        yield s


def test_round_trip_matches_direct_call(server: RunningServer, policy: DiT4DiTPolicy, observations) -> None:
    with server.client() as client:
        meta = client.get_server_metadata()
        assert meta["camera_keys"] == policy.camera_keys
        assert meta["action_dim"] == policy.action_dim and meta["chunk_length"] == policy.chunk_length
        assert meta["image_size"] == list(policy.image_size) and meta["max_message_bytes"] > 0
        out = client.infer({**observations[0], "seed": 3})
    expected = policy.predict_action(observations[0], seed=3)
    assert out["actions"].dtype == np.float32 and out["actions"].shape == (policy.chunk_length, policy.action_dim)
    np.testing.assert_array_equal(out["actions"], expected)
    assert out["server_timing"]["infer_ms"] > 0


def test_openpi_prompt_alias_and_batched_request(server: RunningServer, policy: DiT4DiTPolicy, observations) -> None:
    obs = dict(observations[1])
    obs["prompt"] = obs.pop("instruction")
    batched = {k: np.stack([obs[k], obs[k]]) for k in policy.camera_keys}
    batched.update(state=np.stack([obs["state"]] * 2), prompt=obs["prompt"])
    with server.client() as client:
        single = client.infer({**obs, "seed": 0})["actions"]
        both = client.infer({**batched, "seed": 0})["actions"]
    assert both.shape == (2, *single.shape)
    np.testing.assert_allclose(both[0], single, rtol=1e-5, atol=1e-5)


def test_eight_concurrent_clients(server: RunningServer, policy: DiT4DiTPolicy, observations) -> None:
    expected = [policy.predict_action(obs, seed=i) for i, obs in enumerate(observations)]

    def session(i: int) -> list[np.ndarray]:
        with server.client() as client:
            return [client.infer({**observations[i], "seed": i})["actions"] for _ in range(3)]

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(session, range(8), timeout=TIMEOUT * 4))
    for i, replies in enumerate(results):
        for r in replies:
            np.testing.assert_array_equal(r, expected[i])


@pytest.mark.parametrize(
    ("message", "match"),
    [
        (b"\xc1\x00garbage", "malformed msgpack"),
        ("a text frame", "text frame"),
        (msgpack.packb([1, 2, 3]), "observation dict"),
        (msgpack.packb({"x": {b"__ndarray__": True, b"data": bytes(8), b"dtype": "|O", b"shape": [1]}}), "unsupported dtype"),
        (msgpack.packb({"x": {b"__ndarray__": True, b"data": bytes(3), b"dtype": "<f4", b"shape": [1]}}), "3 bytes"),
    ],
)
def test_malformed_message_gets_error_and_connection_survives(
    server: RunningServer, observations, message: Any, match: str
) -> None:
    with server.raw() as ws:
        ws.send(message)
        reply = msgpack_numpy.unpackb(ws.recv(timeout=TIMEOUT))
        assert match in reply["error"]
        ws.send(msgpack_numpy.packb(observations[0]))  # the same connection still serves
        assert "actions" in msgpack_numpy.unpackb(ws.recv(timeout=TIMEOUT))


def _bad_inputs(policy: DiT4DiTPolicy, obs: dict[str, Any]) -> list[tuple[dict[str, Any], str]]:
    cam = policy.camera_keys[0]
    renamed = {("observation.images.front" if k == cam else k): v for k, v in obs.items()}
    no_instruction = {k: v for k, v in obs.items() if k != "instruction"}
    return [
        (renamed, "missing ['observation.images.cam_high']"),
        ({**obs, cam: obs[cam].astype(np.float32) / 255}, "expected a uint8 RGB image, got dtype float32"),
        ({**obs, cam: np.ascontiguousarray(obs[cam].transpose(2, 0, 1))}, "channels-first"),
        ({**obs, cam: np.zeros((48, 32, 3), np.uint8)}, "aspect ratio"),
        ({**obs, "state": obs["state"][:-1]}, f"state: expected shape ({policy.state_dim},)"),
        ({**obs, "state": np.full(policy.state_dim, np.nan)}, "NaN"),
        (no_instruction, "missing ['instruction']"),
        ({**obs, "instruction": 3}, "instruction: expected a str"),
        ({**obs, "seed": "x"}, "seed must be an int"),
    ]


def test_each_bad_input_gets_one_clear_error(server: RunningServer, policy: DiT4DiTPolicy, observations) -> None:
    with server.client() as client:
        for obs, match in _bad_inputs(policy, observations[0]):
            with pytest.raises(ServerError, match=match.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
                client.infer(obs)
        assert client.infer(observations[0])["actions"].shape == (policy.chunk_length, policy.action_dim)


def test_oversized_messages(policy: DiT4DiTPolicy, observations) -> None:
    with RunningServer(policy, max_message_bytes=20_000) as srv:
        big = {**observations[0], policy.camera_keys[0]: np.zeros((64, 64, 3), np.uint8)}  # ~12 KiB + 2 x 3 KiB
        big[policy.camera_keys[1]] = np.zeros((80, 80, 3), np.uint8)
        with srv.client() as client:
            with pytest.raises(ServerError, match="exceeds the server limit of 20000 bytes"):
                client.infer(big)
            assert "actions" in client.infer(observations[0])  # same connection keeps working
        # Far beyond the limit: refused by the websocket layer without buffering it (close 1009).
        with srv.raw() as ws:
            ws.send(b"\x00" * 200_000)
            with pytest.raises(websockets.ConnectionClosed) as info:
                ws.recv(timeout=TIMEOUT)
            assert info.value.rcvd is not None and info.value.rcvd.code == 1009
        with srv.client() as client:  # and the server still serves new connections
            assert "actions" in client.infer(observations[0])


def test_ping_and_other_clients_are_answered_during_slow_inference(policy: DiT4DiTPolicy, observations) -> None:
    delay = 2.0
    with RunningServer(SlowPolicy(policy, delay)) as srv, srv.raw() as ws:
        t0 = time.monotonic()
        ws.send(msgpack_numpy.packb(observations[0]))
        time.sleep(0.2)  # the request is now on the inference thread
        assert ws.ping().wait(timeout=delay / 2), "no pong while inference was running"
        t_pong = time.monotonic() - t0
        other = srv.client()  # a second client connects and gets its metadata meanwhile
        t_other = time.monotonic() - t0
        other.close()
        reply = msgpack_numpy.unpackb(ws.recv(timeout=TIMEOUT))
        t_reply = time.monotonic() - t0
    assert "actions" in reply
    assert t_pong < delay and t_other < delay <= t_reply


def test_health_check(server: RunningServer) -> None:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.server.port}/healthz", timeout=TIMEOUT) as r:
        assert r.status == 200


def test_cli_refuses_a_folder_that_is_not_a_policy(tmp_path, capsys) -> None:
    assert serve_main(["--checkpoint", str(tmp_path), "--port", "0"]) == 2
    assert "not a policy folder" in capsys.readouterr().err
