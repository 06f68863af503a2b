"""Synchronous websocket clients for ``python -m dit4dit_npu.serve`` (openpi's wire format).

    from dit4dit_client import WebsocketClientPolicy

    policy = WebsocketClientPolicy("127.0.0.1", 8000)
    print(policy.get_server_metadata())  # camera_keys, image_size, action_dim, chunk_length ...
    out = policy.infer({"observation.images.cam_high": img, ..., "state": q, "instruction": "..."})
    actions = out["actions"]  # (chunk_length, action_dim) float32, robot units

    # real-time chunking on this connection's session (the server keeps the last chunk):
    out = policy.infer(obs, rtc={"executed": 5, "inference_delay": 3})

An error reply from the server (bad input) raises ``ServerError`` with the server's one-line
message; the connection stays usable for the next call. Every call ends: the metadata read within
``connect_timeout_s``, each reply within ``request_timeout_s`` (``ServerTimeoutError``; the
connection is then closed), a server that dies or stops answering keepalive pings within
``ping_interval_s`` + 20 s (``ConnectionLostError``). A reply is checked before it is returned
(``checks.py``: actions present, of the metadata's ``action_shape``, finite; ``check_replies=False``
turns that off for debugging), and a request before it is sent (seed range, values msgpack carries). The server reports errors as openpi's
does (a text frame), so openpi's own ``WebsocketClientPolicy`` works against it unchanged too.

``Dit4DitClient`` speaks DiT4DiT's own protocol on the same server (model-space examples in,
normalized actions out).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import time
from collections.abc import Sequence
from typing import Any

import websockets.sync.client
from websockets.exceptions import ConnectionClosed, InvalidMessage, InvalidStatus, InvalidURI

from dit4dit_client import checks, msgpack_numpy
from dit4dit_client.errors import (
    ClientError,
    ConnectionLostError,
    RequestError,
    ServerTimeoutError,
    ServerUnreachableError,
)

logger = logging.getLogger(__name__)

# Above the server's default message limit; replies are small, but the metadata and action
# chunks of large configs should never hit a client-side cap.
_CLIENT_MAX_SIZE = 64 * 1024 * 1024
# The slowest legitimate reply is the first one with an instruction the policy was not trained
# on, at full size on CPU: the server loads the text encoder (Qwen2.5-VL-7B's language model, 16.6
# GB of bf16 weights), encodes the instruction (512 tokens, ~6.7 TFLOP: ~2.7 min at the 40-44
# GFLOP/s fp32 this 2-core host measures) and runs the model (~1.5-2 TFLOP, under a minute): about
# 4-5 min here, seconds on an accelerator. 600 s is twice that; a server that dies or freezes is
# found sooner, by the keepalive pings. client/README.md ("Timeouts") has the numbers.
DEFAULT_REQUEST_TIMEOUT_S = 600.0
# Closing waits this long for the server's close frame: a server that does not answer one is gone.
_CLOSE_TIMEOUT_S = 2.0
_MIN_WAIT_S = 1.0  # each connect attempt and the metadata read get at least this long
OPENPI_CTRL = "__ctrl__"


class ServerError(ClientError, RuntimeError):
    """The server refused the request (its message is the text); the connection lives on."""


def _positive(value: float, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name}: expected a finite number of seconds > 0, got {value!r}")
    return float(value)


class _Connection:
    """One websocket to a policy server, its metadata read on connect."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int | None = 8000,
        *,
        connect_timeout_s: float = 300.0,
        retry_interval_s: float = 2.0,
        ping_interval_s: float | None = 20.0,
        request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
        check_replies: bool = True,
    ) -> None:
        """``connect_timeout_s`` bounds connecting and reading the metadata (the server may still be
        loading the model: refused connections are retried until then); ``request_timeout_s`` is
        each call's default wait for its reply; ``check_replies=False`` returns replies unchecked
        (debugging a server only: such a reply must not reach a robot)."""
        self._uri = host if host.startswith(("ws://", "wss://")) else f"ws://{host}"
        if port is not None:
            self._uri += f":{port}"
        self.request_timeout_s = _positive(request_timeout_s, "request_timeout_s")
        self._check_replies = check_replies
        self._closed: str | None = None  # why this client can no longer be used
        # websockets >= 16 wants connect() entered as a context manager; the stack keeps it open
        # for the life of this object (closed by close()/__exit__).
        self._stack = contextlib.ExitStack()
        try:
            self._ws, self._metadata = self._connect(
                _positive(connect_timeout_s, "connect_timeout_s"), retry_interval_s, ping_interval_s
            )
            self._action_shape = checks.check_metadata(self._metadata, self._uri) if check_replies else None
        except BaseException:
            self._stack.close()
            raise

    def _connect(
        self, timeout_s: float, retry_s: float, ping_interval_s: float | None
    ) -> tuple[websockets.sync.client.ClientConnection, dict[str, Any]]:
        # The server may still be loading the model: retry until the deadline, like openpi.
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                ws = self._stack.enter_context(websockets.sync.client.connect(
                    self._uri,
                    compression=None,
                    max_size=_CLIENT_MAX_SIZE,
                    ping_interval=ping_interval_s,
                    close_timeout=_CLOSE_TIMEOUT_S,
                    # Robots often sit behind a site proxy that must not see localhost traffic.
                    proxy=None,
                    open_timeout=max(_MIN_WAIT_S, min(10.0, deadline - time.monotonic())),
                ))
                break
            except (InvalidURI, ValueError) as e:  # a malformed address (port 99999): no retry helps
                raise ValueError(f"{self._uri} is not a valid websocket address ({e})") from None
            except InvalidStatus as e:  # an HTTP server (or a proxy) answered, not a websocket server
                raise ServerUnreachableError(
                    f"no policy server at {self._uri}: it answered HTTP {e.response.status_code} to the websocket "
                    "handshake (another service on that port, or a proxy in the way?)"
                ) from None
            except (ConnectionRefusedError, TimeoutError, InvalidMessage, OSError) as e:
                if time.monotonic() + retry_s > deadline:
                    raise ServerUnreachableError(f"no policy server at {self._uri}: {e}") from e
                logger.info("waiting for policy server at %s (%s)", self._uri, e)
                time.sleep(retry_s)
        # The handshake alone proves little: a server that accepts and then sends nothing (not a
        # policy server, or one stuck) must not hold the robot past the same deadline.
        try:
            message = ws.recv(timeout=max(_MIN_WAIT_S, deadline - time.monotonic()))
        except TimeoutError:
            raise ServerTimeoutError(
                f"{self._uri}: connected, but no metadata within connect_timeout_s = {timeout_s:g} s "
                "(is a dit4dit_npu.serve policy server listening there?)"
            ) from None
        except ConnectionClosed as e:
            raise ConnectionLostError(f"{self._uri}: closed the connection before sending its metadata ({e})") from None
        return ws, self._decode(message)

    @staticmethod
    def _decode(message: str | bytes) -> dict[str, Any]:
        if isinstance(message, str):  # openpi's convention: errors come as text frames
            raise ServerError(message)
        reply = msgpack_numpy.unpackb(message)
        if not isinstance(reply, dict):
            raise ServerError(f"unexpected reply of type {type(reply).__name__}")
        return reply

    def _call(self, msg: dict[str, Any], timeout_s: float | None) -> dict[str, Any]:
        """Send one request (checked and packed first: nothing leaves for a refused one) and wait
        at most ``timeout_s`` (None: ``request_timeout_s``) for its reply."""
        data = checks.pack_request(msg)
        timeout = self.request_timeout_s if timeout_s is None else _positive(timeout_s, "timeout_s")
        if self._closed is not None:
            raise ConnectionLostError(f"{self._uri}: {self._closed}; connect a new client")
        try:
            self._ws.send(data)
            message = self._ws.recv(timeout=timeout)
        except TimeoutError:
            # The reply may still come, and would then be read as the answer to the next request.
            self._close(f"closed after no reply within {timeout:g} s")
            raise ServerTimeoutError(
                f"{self._uri}: no reply within {timeout:g} s (request_timeout_s); the connection is closed "
                "(a late reply would answer the next request): connect a new client"
            ) from None
        except ConnectionClosed as e:
            self._close(f"the connection was lost ({e})")
            raise ConnectionLostError(f"{self._uri}: connection lost ({e})") from None
        return self._decode(message)

    def get_server_metadata(self) -> dict[str, Any]:
        return self._metadata

    def _close(self, why: str) -> None:
        self._closed = self._closed or why
        self._stack.close()

    def close(self) -> None:
        self._close("the client was closed")

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class WebsocketClientPolicy(_Connection):
    """``infer(obs) -> {"actions": ndarray, "server_timing": {...}, "chunk_id": int}`` (ours and
    openpi's observation layouts; the server's metadata lists both)."""

    def infer(
        self, obs: dict[str, Any], *, rtc: dict[str, Any] | None = None, timeout_s: float | None = None
    ) -> dict[str, Any]:
        """Send one observation, wait for its action chunk (at most ``timeout_s``, default the
        client's ``request_timeout_s``). ``rtc``: real-time chunking fields (``{"executed": s,
        "inference_delay": d}`` on this connection's session, or ``{"prev_chunk": rest,
        "inference_delay": d}``; docs/serving.md). The reply's ``actions`` are checked
        (present, the metadata's ``action_shape``, finite: ``BadReplyError``); an openpi control
        message (``{"__ctrl__": ...}``) gets its acknowledgement instead."""
        if not isinstance(obs, dict):
            raise RequestError(f"obs: expected a dict of observation keys, got {type(obs).__name__}")
        msg = obs if rtc is None else {**obs, "rtc": rtc}
        checks.check_seed(msg.get("seed"))
        reply = self._call(msg, timeout_s)
        if self._check_replies:
            if OPENPI_CTRL in msg:
                checks.check_ack(reply, self._uri, msg[OPENPI_CTRL])
            else:
                checks.check_actions(reply, self._uri, self._action_shape)
        return reply

    def reset(self, *, timeout_s: float | None = None) -> None:
        """A new episode: the server forgets this connection's previous chunk (openpi's
        ``episode_start`` control message; its acknowledgement is checked)."""
        reply = self._call({OPENPI_CTRL: "episode_start"}, timeout_s)
        if self._check_replies:
            checks.check_ack(reply, self._uri, "episode_start", expected="episode_start")


class Dit4DitClient(_Connection):
    """DiT4DiT's own protocol: examples already in model space (views resized and tiled, state
    encoded and padded: the metadata's ``dit4dit_examples``) -> the NORMALIZED chunk, padded dims
    included (un-normalize with the metadata's ``policy_io`` statistics)."""

    _ids = itertools.count()

    def predict(self, examples: Sequence[dict[str, Any]], seed: int | None = None, *,
                timeout_s: float | None = None) -> Any:
        """``[{"image": frame uint8 (H, W_tiled, 3), "state": (1, S), "lang": str}, ...]`` ->
        float32 (B, chunk, action_width), checked: B the examples sent, chunk the metadata's
        ``chunk_length``, finite."""
        checks.check_seed(seed)
        rid = f"req-{next(self._ids)}"
        msg: dict[str, Any] = {"type": "infer", "request_id": rid, "examples": list(examples)}
        if seed is not None:
            msg["seed"] = seed
        reply = self._envelope(self._call(msg, timeout_s))
        if not self._check_replies:
            return reply["data"]["normalized_actions"]
        return checks.check_normalized(reply, self._uri, rid, len(msg["examples"]), self._metadata.get("chunk_length"))

    def ping(self, *, timeout_s: float | None = None) -> bool:
        return bool(self._envelope(self._call({"type": "ping"}, timeout_s))["ok"])

    @staticmethod
    def _envelope(reply: dict[str, Any]) -> dict[str, Any]:
        if reply.get("status") != "ok":
            raise ServerError((reply.get("error") or {}).get("message", f"error reply {reply!r:.200}"))
        return reply
