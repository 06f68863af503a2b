"""Policy server over real websockets on 127.0.0.1 with the real tiny policy (no server mocks).

Protocol-level tests (openpi's ALOHA layout, DiT4DiT's own messages, batching, instruction
limits) are in test_serve_protocols.py; both share the helpers in serve_fixtures.py.
"""

from __future__ import annotations

import re
import socket
import time
import urllib.request
from typing import Any

import msgpack
import numpy as np
import pytest
import websockets.sync.client
from dit4dit_client import RequestError, ServerError, msgpack_numpy
from serve_fixtures import TIMEOUT, RunningServer, SlowPolicy, concurrently, load_policy, sample_observations

from dit4dit_npu.policy import DiT4DiTPolicy
from dit4dit_npu.serve.cli import main as serve_main
from dit4dit_npu.serve.server import PolicyServer, ServeError


@pytest.fixture(scope="module")
def policy() -> DiT4DiTPolicy:
    return load_policy()


@pytest.fixture(scope="module")
def observations(policy: DiT4DiTPolicy) -> list[dict[str, Any]]:
    return sample_observations(policy)


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
        assert meta["action_shape"] == [policy.chunk_length, policy.action_dim]
        assert meta["observation_layouts"]["openpi"]["images"]["cam_high"] == "observation.images.cam_high"
        assert meta["dit4dit_examples"]["image"] == [*policy.io.frame_size, 3]
        assert meta["policy_io"] == policy.io.to_dict() and meta["batching"]["max_batch"] >= 1
        out = client.infer({**observations[0], "seed": 3})
    expected = policy.predict_action(observations[0], seed=3)
    assert out["actions"].dtype == np.float32 and out["actions"].shape == (policy.chunk_length, policy.action_dim)
    np.testing.assert_array_equal(out["actions"], expected)
    assert out["server_timing"]["infer_ms"] > 0 and out["server_timing"]["batch_size"] == 1


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


def test_concurrent_clients_with_their_own_seeds_get_their_single_call_answers(
    server: RunningServer, policy: DiT4DiTPolicy, observations
) -> None:
    # Different seeds never share a model call (a seeded call draws one noise for all its rows),
    # so every reply is bit-identical to its own single call.
    expected = [policy.predict_action(obs, seed=i) for i, obs in enumerate(observations)]
    replies = concurrently(server, [{**obs, "seed": i} for i, obs in enumerate(observations)], rounds=2)
    for i, per_round in enumerate(replies):
        for r in per_round:
            np.testing.assert_array_equal(r["actions"], expected[i])


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
def test_malformed_message_gets_an_openpi_error_frame_and_connection_survives(
    server: RunningServer, observations, message: Any, match: str
) -> None:
    # openpi's server reports errors as a text frame (its client raises RuntimeError with it).
    with server.raw() as ws:
        ws.send(message)
        reply = ws.recv(timeout=TIMEOUT)
        assert isinstance(reply, str) and match in reply and "\n" not in reply
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
        ({**obs, "prompt": obs["instruction"]}, "both 'prompt' and 'instruction'"),
        ({**obs, "seed": "x"}, "seed: expected an int in [0, 2**63), got str"),
        ({**obs, "seed": 1.0}, "seed: expected an int in [0, 2**63), got float"),
        ({**obs, "seed": True}, "seed: expected an int in [0, 2**63), got bool"),
        ({**obs, "seed": -1}, "seed: -1 is out of range"),
        ({**obs, "seed": 2**63}, f"seed: {2**63} is out of range"),
    ]


def test_each_bad_input_gets_one_clear_error(server: RunningServer, policy: DiT4DiTPolicy, observations) -> None:
    with server.client() as client, server.raw() as ws:
        for obs, match in _bad_inputs(policy, observations[0]):
            if "seed" in obs:  # refused by the client before sending, in the server's words; and by the server
                with pytest.raises(RequestError, match=re.escape(match)):
                    client.infer(obs)
                ws.send(msgpack_numpy.packb(obs))
                reply = ws.recv(timeout=TIMEOUT)
                assert isinstance(reply, str) and match in reply and "\n" not in reply
                continue
            with pytest.raises(ServerError) as info:
                client.infer(obs)
            assert match in str(info.value) and "\n" not in str(info.value)
        assert client.infer(observations[0])["actions"].shape == (policy.chunk_length, policy.action_dim)
        assert client.infer({**observations[0], "seed": np.uint64(2**63 - 1)})["actions"].ndim == 2


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
    assert serve_main(["--policy", str(tmp_path), "--port", "0"]) == 2
    assert "not a policy folder" in capsys.readouterr().err


def test_busy_port_is_one_line_before_the_model_loads(policy: DiT4DiTPolicy, tmp_path, capsys) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        t0 = time.monotonic()
        # A folder that is not a policy: the port is checked first, so the port error wins.
        assert serve_main(["--policy", str(tmp_path), "--port", str(port)]) == 2
        assert time.monotonic() - t0 < 5
        err = capsys.readouterr().err.strip()
        assert err == f"error: cannot listen on 127.0.0.1:{port}: the port is already in use " \
                      "(another server? choose another --port)"
        # Taken while the model loaded: PolicyServer.start says the same.
        with RunningServer(policy) as srv, pytest.raises(ServeError, match="already in use"):
            srv.call(PolicyServer(policy, "127.0.0.1", port).start())


def test_cli_checks_its_numbers(capsys) -> None:
    for args, match in ((["--max-batch", "0"], "--max-batch must be >= 1"),
                        (["--batch-window-ms", "-1"], "--batch-window-ms must be >= 0"),
                        (["--max-new-instructions", "-2"], "--max-new-instructions must be >= 0"),
                        (["--port", "99999"], "--port must be in 0..65535, got 99999"),  # was OverflowError
                        (["--port", "-1"], "--port must be in 0..65535, got -1"),  # was 'unknown host'
                        (["--log-level", "LOUD"], "--log-level must be DEBUG, INFO, WARNING or ERROR"),
                        # NaN passed every comparison, inf overflowed int() after the model load (tracebacks)
                        (["--max-message-mb", "nan"], "--max-message-mb must be a finite number, got nan"),
                        (["--max-decoded-mb", "inf"], "--max-decoded-mb must be a finite number, got inf"),
                        (["--batch-window-ms", "nan"], "--batch-window-ms must be a finite number, got nan"),
                        # the cap was ignored without a word
                        (["--max-new-instructions", "2", "--refuse-new-instructions"],
                         "--max-new-instructions 2 with --refuse-new-instructions")):
        with pytest.raises(SystemExit) as info:
            serve_main(["--policy", "x", *args])
        assert info.value.code == 2 and match in capsys.readouterr().err
    from dit4dit_npu.serve.cli import parse_args

    assert parse_args(["--policy", "x"]).max_new_instructions == 8  # the default, unchanged
    assert parse_args(["--policy", "x", "--refuse-new-instructions"]).max_new_instructions == 8


def test_client_refuses_a_malformed_address_at_once() -> None:
    """Was websockets' InvalidURI / a bare 'Port out of range' ValueError (sim.eval: a traceback)."""
    from dit4dit_client import WebsocketClientPolicy

    for uri, why in (("ws://127.0.0.1:99999", "Port out of range"), ("ws://", "hostname isn't provided")):
        t0 = time.monotonic()
        with pytest.raises(ValueError, match=f"{uri} is not a valid websocket address .*{why}"):
            WebsocketClientPolicy(uri, None, connect_timeout_s=30)
        assert time.monotonic() - t0 < 5  # no retrying until the connect timeout
