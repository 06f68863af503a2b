"""Synchronous websocket clients for ``python -m dit4dit_npu.serve`` (openpi's wire format).

    from dit4dit_client import WebsocketClientPolicy

    policy = WebsocketClientPolicy("127.0.0.1", 8000)
    print(policy.get_server_metadata())  # camera_keys, image_size, action_dim, chunk_length ...
    out = policy.infer({"observation.images.cam_high": img, ..., "state": q, "instruction": "..."})
    actions = out["actions"]  # (chunk_length, action_dim) float32, robot units

    # real-time chunking on this connection's session (the server keeps the last chunk):
    out = policy.infer(obs, rtc={"executed": 5, "inference_delay": 3})

An error reply from the server (bad input) raises ``ServerError`` with the server's one-line
message; the connection stays usable for the next call. The server reports errors as openpi's
does (a text frame), so openpi's own ``WebsocketClientPolicy`` works against it unchanged too.

``Dit4DitClient`` speaks DiT4DiT's own protocol on the same server (model-space examples in,
normalized actions out).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import time
from collections.abc import Sequence
from typing import Any

import websockets.sync.client
from websockets.exceptions import InvalidMessage, InvalidURI

from dit4dit_client import msgpack_numpy
from dit4dit_client.errors import ClientError

logger = logging.getLogger(__name__)

# Above the server's default message limit; replies are small, but the metadata and action
# chunks of large configs should never hit a client-side cap.
_CLIENT_MAX_SIZE = 64 * 1024 * 1024


class ServerError(ClientError, RuntimeError):
    """The server refused the request (its message is the text); the connection lives on."""


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
    ) -> None:
        self._uri = host if host.startswith(("ws://", "wss://")) else f"ws://{host}"
        if port is not None:
            self._uri += f":{port}"
        # websockets >= 16 wants connect() entered as a context manager; the stack keeps it open
        # for the life of this object (closed by close()/__exit__).
        self._stack = contextlib.ExitStack()
        self._ws, self._metadata = self._connect(connect_timeout_s, retry_interval_s, ping_interval_s)

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
                    # Robots often sit behind a site proxy that must not see localhost traffic.
                    proxy=None,
                    open_timeout=max(1.0, min(10.0, deadline - time.monotonic())),
                ))
                break
            except (InvalidURI, ValueError) as e:  # a malformed address (port 99999): no retry helps
                raise ValueError(f"{self._uri} is not a valid websocket address ({e})") from None
            except (ConnectionRefusedError, TimeoutError, InvalidMessage, OSError) as e:
                if time.monotonic() + retry_s > deadline:
                    raise ConnectionError(f"no policy server at {self._uri}: {e}") from e
                logger.info("waiting for policy server at %s (%s)", self._uri, e)
                time.sleep(retry_s)
        return ws, self._decode(ws.recv())

    @staticmethod
    def _decode(message: str | bytes) -> dict[str, Any]:
        if isinstance(message, str):  # openpi's convention: errors come as text frames
            raise ServerError(message)
        reply = msgpack_numpy.unpackb(message)
        if not isinstance(reply, dict):
            raise ServerError(f"unexpected reply of type {type(reply).__name__}")
        return reply

    def _call(self, msg: dict[str, Any]) -> dict[str, Any]:
        self._ws.send(msgpack_numpy.packb(msg))
        return self._decode(self._ws.recv())

    def get_server_metadata(self) -> dict[str, Any]:
        return self._metadata

    def close(self) -> None:
        self._stack.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class WebsocketClientPolicy(_Connection):
    """``infer(obs) -> {"actions": ndarray, "server_timing": {...}, "chunk_id": int}`` (ours and
    openpi's observation layouts; the server's metadata lists both)."""

    def infer(self, obs: dict[str, Any], *, rtc: dict[str, Any] | None = None) -> dict[str, Any]:
        """Send one observation, wait for its action chunk. ``rtc``: real-time chunking fields
        (``{"executed": s, "inference_delay": d}`` on this connection's session, or
        ``{"prev_chunk": rest, "inference_delay": d}``; README "Serve a policy")."""
        return self._call(obs if rtc is None else {**obs, "rtc": rtc})

    def reset(self) -> None:
        """A new episode: the server forgets this connection's previous chunk (openpi's
        ``episode_start`` control message)."""
        self._call({"__ctrl__": "episode_start"})


class Dit4DitClient(_Connection):
    """DiT4DiT's own protocol: examples already in model space (views resized and tiled, state
    encoded and padded: the metadata's ``dit4dit_examples``) -> the NORMALIZED chunk, padded dims
    included (un-normalize with the metadata's ``policy_io`` statistics)."""

    _ids = itertools.count()

    def predict(self, examples: Sequence[dict[str, Any]], seed: int | None = None) -> Any:
        """``[{"image": frame uint8 (H, W_tiled, 3), "state": (1, S), "lang": str}, ...]`` ->
        float32 (B, chunk, action_width)."""
        msg: dict[str, Any] = {"type": "infer", "request_id": f"req-{next(self._ids)}", "examples": list(examples)}
        if seed is not None:
            msg["seed"] = seed
        return self._envelope(self._call(msg))["data"]["normalized_actions"]

    def ping(self) -> bool:
        return bool(self._envelope(self._call({"type": "ping"}))["ok"])

    @staticmethod
    def _envelope(reply: dict[str, Any]) -> dict[str, Any]:
        if reply.get("status") != "ok":
            raise ServerError((reply.get("error") or {}).get("message", f"error reply {reply!r:.200}"))
        return reply
