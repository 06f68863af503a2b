"""Every client call ends, and no reply a robot should not execute is returned: the robot-side
client (client/dit4dit_client) against real websocket servers on 127.0.0.1 that misbehave (silent
after the handshake, silent after a request, replies without actions, with NaN, of the wrong shape,
killed mid-run), requests refused before they are sent, and a process that exits while a request
hangs. Each call runs under its own thread deadline (``within``): a hang fails the test instead of
stalling the tier."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import subprocess
import sys
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import pytest
import websockets
import websockets.asyncio.server as ws_server
from dit4dit_client import (
    AsyncChunkRunner,
    BadReplyError,
    ChunkExecutor,
    ClientError,
    ConnectionLostError,
    Dit4DitClient,
    RequestError,
    ServerTimeoutError,
    ServerUnreachableError,
    WebsocketClientPolicy,
    msgpack_numpy,
    websocket_infer,
)

H, A = 4, 3  # the fake policy's chunk length and action dim
META = {"policy": "misbehaving", "chunk_length": H, "action_dim": A, "action_shape": [H, A]}
OBS = {"state": np.zeros(A, np.float32), "instruction": "pick"}
DEADLINE = 30.0  # per call: far beyond every timeout used here, so only a hang reaches it
SILENT = object()  # a behaviour's answer: never reply


def within(seconds: float, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args)`` on a daemon thread; its result or exception, or a failure if it does not end."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as e:
            box["error"] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        pytest.fail(f"{getattr(fn, '__name__', fn)} still waiting after {seconds} s: the call does not end")
    if "error" in box:
        raise box["error"]
    return box.get("value")


Behaviour = Callable[[dict[str, Any], Any], Awaitable[Any]]


async def actions_of(shape: tuple[int, ...], fill: float = 0.0) -> dict[str, Any]:
    return {"actions": np.full(shape, fill, np.float32), "server_timing": {}}


def answering(make: Callable[[dict[str, Any]], Any], delay_s: float = 0.0) -> Behaviour:
    """A behaviour that answers each message with ``make(msg)`` (SILENT: never) after ``delay_s``."""

    async def behaviour(msg: dict[str, Any], ws: Any) -> Any:
        if delay_s:
            await asyncio.sleep(delay_s)
        return make(msg)

    return behaviour


def good(msg: dict[str, Any]) -> Any:
    if "__ctrl__" in msg:
        return {"__ack__": msg["__ctrl__"]}
    return {"actions": np.zeros((H, A), np.float32), "server_timing": {}}


class MisbehavingServer:
    """A real websockets server on 127.0.0.1:0 in a background event loop: it sends ``metadata``
    (None: nothing, ever) and answers each message as ``behaviour`` says."""

    def __init__(self, behaviour: Behaviour, metadata: dict[str, Any] | None = META) -> None:
        self.behaviour, self.metadata = behaviour, metadata
        self.received: list[dict[str, Any]] = []
        self.connections: list[ws_server.ServerConnection] = []
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> MisbehavingServer:
        self.thread.start()
        self.server = self._call(self._start())
        return self

    async def _start(self) -> ws_server.Server:
        return await ws_server.serve(self._handle, "127.0.0.1", 0, compression=None, max_size=None)

    def __exit__(self, *exc: object) -> None:
        self._call(self._shutdown())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(DEADLINE)
        self.loop.close()

    async def _shutdown(self) -> None:
        self._abort()
        await self.server.wait_closed()  # every handler has returned

    def _call(self, coro: Awaitable[Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(DEADLINE)

    @property
    def uri(self) -> str:
        return f"ws://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _handle(self, ws: ws_server.ServerConnection) -> None:
        self.connections.append(ws)
        if self.metadata is None:  # accepts the websocket, then says nothing
            await ws.wait_closed()
            return
        with contextlib.suppress(websockets.ConnectionClosed):  # killed: nothing left to answer
            await ws.send(msgpack_numpy.packb(self.metadata))
            async for message in ws:
                msg = msgpack_numpy.unpackb(message)
                self.received.append(msg)
                reply = await self.behaviour(msg, ws)
                if reply is not SILENT:
                    await ws.send(reply if isinstance(reply, str) else msgpack_numpy.packb(reply))

    def kill(self) -> None:
        """As a killed process: every connection dropped without a close frame, nothing listening
        (from a behaviour, on the server's own loop, or from the test)."""
        if threading.current_thread() is self.thread:
            self._abort()
        else:
            self.loop.call_soon_threadsafe(self._abort)

    def _abort(self) -> None:
        self.server.close(close_connections=False)
        for ws in self.connections:
            ws.transport.abort()


def one_line(e: BaseException, *parts: str) -> str:
    text = str(e)
    assert "\n" not in text and all(p in text for p in parts), text
    return text


# ----------------------------------------------------------------------------- deadlines


def test_a_server_silent_after_the_handshake_fails_the_connect_within_connect_timeout_s():
    with MisbehavingServer(answering(good), metadata=None) as srv:
        with pytest.raises(ServerTimeoutError) as info:
            within(DEADLINE, WebsocketClientPolicy, srv.uri, None, connect_timeout_s=1.5)
        one_line(info.value, srv.uri, "no metadata within connect_timeout_s = 1.5 s")
        with pytest.raises(ServerTimeoutError):
            within(DEADLINE, Dit4DitClient, srv.uri, None, connect_timeout_s=1)


def test_an_http_server_on_the_port_is_one_client_error_naming_the_address_and_status():
    # A web server (or a proxy) answering the upgrade with 404 was websockets' InvalidStatus traceback.
    import http.server

    class NotFound(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    httpd = http.server.HTTPServer(("127.0.0.1", 0), NotFound)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        uri = f"ws://127.0.0.1:{httpd.server_address[1]}"
        with pytest.raises(ServerUnreachableError) as info:
            within(DEADLINE, WebsocketClientPolicy, uri, None, connect_timeout_s=5)
        assert isinstance(info.value, ClientError) and isinstance(info.value, ConnectionError)
        one_line(info.value, uri, "answered HTTP 404")
    finally:
        httpd.shutdown()
        thread.join(DEADLINE)


def test_nothing_listening_is_a_client_error_that_is_still_a_connection_error():
    import socket

    with socket.socket() as s:  # a port just free: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ServerUnreachableError) as info:
        within(DEADLINE, WebsocketClientPolicy, "127.0.0.1", port, connect_timeout_s=1, retry_interval_s=0.5)
    assert isinstance(info.value, ConnectionError)
    one_line(info.value, f"ws://127.0.0.1:{port}", "no policy server at")


def test_a_server_silent_after_a_request_times_out_naming_server_and_seconds_then_the_client_is_closed():
    with MisbehavingServer(answering(lambda m: SILENT)) as srv:
        client = within(DEADLINE, WebsocketClientPolicy, srv.uri, None, connect_timeout_s=10, request_timeout_s=1.5)
        with pytest.raises(ServerTimeoutError) as info:
            within(DEADLINE, client.infer, OBS)
        one_line(info.value, srv.uri, "no reply within 1.5 s", "connect a new client")
        assert isinstance(info.value, TimeoutError) and isinstance(info.value, ClientError)
        # a late reply would now answer the next request: the connection is closed, and says why
        with pytest.raises(ConnectionLostError, match="closed after no reply within 1.5 s"):
            within(DEADLINE, client.infer, OBS)
        # reset() and a per-call timeout, on a fresh client
        with WebsocketClientPolicy(srv.uri, None, connect_timeout_s=10) as other:
            with pytest.raises(ServerTimeoutError, match=r"no reply within 0\.5 s"):
                within(DEADLINE, other.reset, timeout_s=0.5)
        with Dit4DitClient(srv.uri, None, connect_timeout_s=10, request_timeout_s=0.5) as d4d:
            with pytest.raises(ServerTimeoutError, match=srv.uri):
                within(DEADLINE, d4d.predict, [{"image": np.zeros((2, 2, 3), np.uint8)}], seed=1)
        with pytest.raises(ValueError, match="request_timeout_s: expected a finite number of seconds > 0"):
            WebsocketClientPolicy(srv.uri, None, request_timeout_s=float("inf"))


def test_a_killed_server_is_a_lost_connection_not_a_wait():
    async def die(msg: dict[str, Any], ws: Any) -> Any:
        ws.transport.abort()
        return SILENT

    with MisbehavingServer(die) as srv, WebsocketClientPolicy(srv.uri, None, connect_timeout_s=10) as client:
        with pytest.raises(ConnectionLostError) as info:
            within(DEADLINE, client.infer, OBS)
        one_line(info.value, srv.uri, "connection lost")
        assert isinstance(info.value, ConnectionError)


# ----------------------------------------------------------------------------- reply checks


@pytest.mark.parametrize(
    "reply, match",
    [
        ({"server_timing": {}}, "reply without 'actions' (keys ['server_timing'])"),
        ({"actions": np.full((H, A), np.nan, np.float32)}, f"{H * A} NaN/inf value(s) in 'actions'"),
        ({"actions": np.array([[0, np.inf, 0]] * H, np.float32)}, f"{H} NaN/inf value(s) in 'actions'"),
        ({"actions": np.zeros((H, A + 1), np.float32)}, f"'actions' of shape ({H}, {A + 1}), expected ({H}, {A})"),
        ({"actions": np.zeros((H + 1, A), np.float32)}, f"expected ({H}, {A}) (the metadata's action_shape)"),
        ({"actions": np.zeros((2, H, A - 1), np.float32)}, f"shape (2, {H}, {A - 1})"),
        ({"actions": [[0.0] * A] * H}, "'actions' is a list, expected a numeric numpy array"),
        ({"actions": np.array(["x"] * A)}, "'actions' is an array of <U1"),
    ],
)
def test_a_reply_a_robot_should_not_execute_is_refused(reply: dict[str, Any], match: str):
    with MisbehavingServer(answering(lambda m: reply)) as srv:
        with WebsocketClientPolicy(srv.uri, None, connect_timeout_s=10) as client:
            with pytest.raises(BadReplyError) as info:
                within(DEADLINE, client.infer, OBS)
            one_line(info.value, srv.uri, match)
            with pytest.raises(BadReplyError):  # the connection lives on: the same answer, refused again
                within(DEADLINE, client.infer, OBS)
        # the debugging opt-out hands it on as it came
        with WebsocketClientPolicy(srv.uri, None, connect_timeout_s=10, check_replies=False) as raw:
            assert within(DEADLINE, raw.infer, OBS).keys() == reply.keys()


def test_good_replies_pass_a_batch_axis_is_allowed_and_without_action_shape_no_shape_is_imposed():
    batched = {"actions": np.zeros((2, H, A), np.float32)}
    with MisbehavingServer(answering(lambda m: batched)) as srv, WebsocketClientPolicy(srv.uri, None) as client:
        assert within(DEADLINE, client.infer, OBS)["actions"].shape == (2, H, A)
    openpi_meta = {k: v for k, v in META.items() if k != "action_shape"}  # openpi's servers send none
    odd = {"actions": np.zeros((10, 7), np.float32)}
    with MisbehavingServer(answering(lambda m: odd), metadata=openpi_meta) as srv:
        with WebsocketClientPolicy(srv.uri, None) as client:
            assert within(DEADLINE, client.infer, OBS)["actions"].shape == (10, 7)
    with MisbehavingServer(answering(good), metadata={**META, "action_shape": "8x14"}) as srv:
        with pytest.raises(BadReplyError, match="metadata action_shape '8x14' is not a list of positive ints"):
            within(DEADLINE, WebsocketClientPolicy, srv.uri, None)


def test_reset_and_control_messages_are_checked_as_acknowledgements():
    with MisbehavingServer(answering(good)) as srv, WebsocketClientPolicy(srv.uri, None) as client:
        within(DEADLINE, client.reset)
        assert within(DEADLINE, client.infer, {"__ctrl__": "episode_end"}) == {"__ack__": "episode_end"}
    with MisbehavingServer(answering(lambda m: {"__ack__": "ignored"})) as srv, WebsocketClientPolicy(srv.uri, None) as c:
        with pytest.raises(BadReplyError, match=r"expected the acknowledgement \{'__ack__': 'episode_start'\}"):
            within(DEADLINE, c.reset)
    with MisbehavingServer(answering(lambda m: {"actions": np.zeros((H, A), np.float32)})) as srv:
        with WebsocketClientPolicy(srv.uri, None) as client, pytest.raises(BadReplyError, match="acknowledgement"):
            within(DEADLINE, client.reset)


def _envelope(normalized: Any, request_id: Any = None) -> Callable[[dict[str, Any]], Any]:
    def make(msg: dict[str, Any]) -> Any:
        if msg.get("type") == "ping":
            return {"status": "ok", "ok": True, "type": "ping"}
        rid = msg["request_id"] if request_id is None else request_id
        return {"status": "ok", "ok": True, "request_id": rid, "data": {"normalized_actions": normalized}}

    return make


@pytest.mark.parametrize(
    "normalized, request_id, match",
    [
        (np.full((1, H, 5), np.nan, np.float32), None, "NaN/inf value(s) in 'normalized_actions'"),
        (np.zeros((2, H, 5), np.float32), None, "normalized_actions of shape (2, 4, 5), expected (1, 4, action_width)"),
        (np.zeros((1, H + 1, 5), np.float32), None, "expected (1, 4, action_width)"),
        (np.zeros((H, 5), np.float32), None, "normalized_actions of shape (4, 5)"),
        (np.zeros((1, H, 5), np.float32), "req-other", "reply for request_id 'req-other'"),
        (None, None, "'normalized_actions' is a NoneType"),
    ],
)
def test_dit4dit_normalized_replies_are_checked(normalized: Any, request_id: Any, match: str):
    with MisbehavingServer(answering(_envelope(normalized, request_id))) as srv, Dit4DitClient(srv.uri, None) as d4d:
        with pytest.raises(BadReplyError) as info:
            within(DEADLINE, d4d.predict, [{"image": np.zeros((2, 2, 3), np.uint8)}], seed=3)
        one_line(info.value, srv.uri, match)


def test_dit4dit_good_reply_passes():
    ok = np.zeros((2, H, 5), np.float32)
    with MisbehavingServer(answering(_envelope(ok))) as srv, Dit4DitClient(srv.uri, None) as d4d:
        assert within(DEADLINE, d4d.ping)
        out = within(DEADLINE, d4d.predict, [{"lang": "a"}, {"lang": "b"}], seed=2**63 - 1)
        assert out.shape == (2, H, 5)


# ----------------------------------------------------------------------------- requests


@pytest.mark.parametrize(
    "extra, match",
    [
        ({"seed": 2**70}, f"seed: {2**70} is out of range, expected an int in [0, 2**63)"),
        ({"seed": -1}, "seed: -1 is out of range"),
        ({"seed": 2**63}, f"seed: {2**63} is out of range"),
        ({"seed": True}, "seed: expected an int in [0, 2**63), got bool"),
        ({"seed": 1.5}, "seed: expected an int in [0, 2**63), got float"),
        ({"tags": {"a", "b"}}, "tags: a value of type set cannot be sent"),
        ({"images": {"cam_high": {1, 2}}}, "images['cam_high']: a value of type set cannot be sent"),
        ({"extra": [1, 2**70]}, "extra[1]: a value of type int cannot be sent"),
        ({"state": np.array([object()])}, "state: a value of type ndarray cannot be sent (unsupported dtype object"),
    ],
)
def test_requests_the_server_or_msgpack_cannot_take_are_refused_before_sending(extra: dict[str, Any], match: str):
    with MisbehavingServer(answering(good)) as srv, WebsocketClientPolicy(srv.uri, None) as client:
        with pytest.raises(RequestError) as info:
            within(DEADLINE, client.infer, {**OBS, **extra})
        one_line(info.value, match)
        assert isinstance(info.value, ValueError)
        within(DEADLINE, client.infer, OBS)  # the connection was never touched
        assert len(srv.received) == 1


def test_dit4dit_predict_refuses_a_seed_out_of_range_before_sending():
    with MisbehavingServer(answering(_envelope(np.zeros((1, H, 5), np.float32)))) as srv, Dit4DitClient(srv.uri, None) as d:
        with pytest.raises(RequestError, match=r"seed: 1180591620717411303424 is out of range"):
            within(DEADLINE, d.predict, [{"lang": "a"}], seed=2**70)
        assert srv.received == []


# ----------------------------------------------------------------------------- the real-time loop


def _runner(client: WebsocketClientPolicy, sent: list, mode: str = "rtc", horizon: int = 2, hz: float = 50,
            **kwargs: Any) -> AsyncChunkRunner:
    return AsyncChunkRunner(websocket_infer(client), ChunkExecutor(mode, execution_horizon=horizon), control_hz=hz,
                            get_observation=lambda: dict(OBS), send_action=sent.append, **kwargs)


def test_the_runner_raises_the_request_timeout_of_a_server_that_falls_silent():
    answered = {"n": 0}

    def first_only(msg: dict[str, Any]) -> Any:
        answered["n"] += 1
        return good(msg) if answered["n"] == 1 else SILENT

    with MisbehavingServer(answering(first_only)) as srv:
        # the loop (150 ticks, 3 s) outlasts the timeout: it stops early, with the client's error
        with WebsocketClientPolicy(srv.uri, None, request_timeout_s=0.5) as client:
            sent: list = []
            with pytest.raises(ServerTimeoutError, match=f"{srv.uri}: no reply within 0.5 s"):
                within(DEADLINE, _runner(client, sent).run, 150)
            assert 0 < len(sent) < 150
        # a run shorter than the timeout: the last request is waited for (bounded), then raised
        answered["n"] = 0
        with WebsocketClientPolicy(srv.uri, None, request_timeout_s=1.0) as client:
            with pytest.raises(ServerTimeoutError, match="no reply within 1 s"):
                within(DEADLINE, _runner(client, []).run, 10)


def test_the_runner_bounds_an_infer_that_never_returns_on_its_own():
    never = threading.Event()

    def infer(obs: dict[str, Any], req: Any) -> np.ndarray:
        never.wait()  # a callable with no timeout of its own
        raise AssertionError("unreachable")

    runner = AsyncChunkRunner(infer, ChunkExecutor("async", execution_horizon=2), control_hz=50,
                              get_observation=lambda: dict(OBS), send_action=lambda a: None, request_timeout_s=0.3)
    with pytest.raises(ServerTimeoutError, match="request of control step 0 got no chunk within request_timeout_s = 0.3 s"):
        within(DEADLINE, runner.run, 500)
    never.set()


def test_the_runner_raises_when_the_server_is_killed_mid_run():
    answered = {"n": 0}
    box: dict[str, MisbehavingServer] = {}

    async def killed_at_the_third(msg: dict[str, Any], ws: Any) -> Any:
        answered["n"] += 1
        if answered["n"] == 3:  # mid-run, with a request in flight
            box["srv"].kill()
            return SILENT
        return good(msg)

    with MisbehavingServer(killed_at_the_third) as srv:
        box["srv"] = srv
        with WebsocketClientPolicy(srv.uri, None, request_timeout_s=60) as client:
            sent: list = []
            with pytest.raises(ConnectionLostError, match=f"{srv.uri}: connection lost"):
                within(DEADLINE, _runner(client, sent).run, 500)
            assert sent and len(sent) < 500


@pytest.mark.slow  # over 4 s of one core: the full tier (the fast tier keeps to 3 minutes)
def test_holding_the_last_action_is_said_once_with_the_numbers(caplog: pytest.LogCaptureFixture):
    # 16-action chunks requested after 4 leave 12 ticks; the server takes 0.5 s = 10 ticks at 20 Hz, so
    # each request waits for the late chunk before it: 2 x 10 > 16 ticks, and the robot holds
    long = 16
    meta = {**META, "chunk_length": long, "action_shape": [long, A]}
    reply = {"actions": np.zeros((long, A), np.float32)}
    with MisbehavingServer(answering(lambda m: reply, delay_s=0.5), metadata=meta) as srv:
        with WebsocketClientPolicy(srv.uri, None) as client:
            with caplog.at_level(logging.WARNING, logger="dit4dit_client.runtime"):
                stats = within(DEADLINE, _runner(client, [], mode="async", horizon=4, hz=20).run, 70)
            holds = [r.getMessage() for r in caplog.records if "holding the last action" in r.getMessage()]
            assert stats.held > 1 and len(holds) == 1, (stats, holds)
            assert "a chunk of 16 actions ran out before the next arrived" in holds[0]
            assert "at 20 Hz, while execution_horizon 4 leaves 12 ticks" in holds[0]
            measured = re.search(r"measured delays up to (\d+) ticks = (\d+) ms", holds[0])
            assert measured and int(measured[1]) >= 10 and int(measured[2]) == 50 * int(measured[1]), holds[0]
            caplog.clear()
            # sync mode holds by design while it computes: no warning
            with caplog.at_level(logging.WARNING, logger="dit4dit_client.runtime"):
                stats = within(DEADLINE, _runner(client, [], mode="sync", horizon=4, hz=20).run, 30)
            assert stats.held > 0 and not [r for r in caplog.records if "holding" in r.getMessage()]


EXIT_SCRIPT = r"""
import sys
from dit4dit_client import AsyncChunkRunner, ChunkExecutor, WebsocketClientPolicy, websocket_infer
import numpy as np

client = WebsocketClientPolicy(sys.argv[1], None, connect_timeout_s=30, request_timeout_s=3600)
sent = []

def send_action(a):
    sent.append(a)
    if len(sent) == 5:  # the robot's own stop while the next request hangs on a silent server
        raise RuntimeError("e-stop")

runner = AsyncChunkRunner(websocket_infer(client), ChunkExecutor("async", execution_horizon=2), control_hz=50,
                          get_observation=lambda: {"state": np.zeros(3, np.float32)}, send_action=send_action)
try:
    runner.run(10_000)
except RuntimeError as e:
    print("stopped:", e, flush=True)
"""


def test_the_process_exits_while_a_request_hangs_on_a_silent_server(tmp_path):
    answered = {"n": 0}

    def first_only(msg: dict[str, Any]) -> Any:
        answered["n"] += 1
        return good(msg) if answered["n"] == 1 else SILENT

    script = tmp_path / "robot.py"
    script.write_text(EXIT_SCRIPT)
    with MisbehavingServer(answering(first_only)) as srv:
        try:
            run = subprocess.run([sys.executable, str(script), srv.uri], capture_output=True, text=True, timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail("the robot process did not exit within 60 s: an inference thread holds it")
        assert run.returncode == 0, run.stderr[-2000:]
        assert "stopped: e-stop" in run.stdout and answered["n"] == 2  # the second request was in flight
