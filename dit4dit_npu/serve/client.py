"""Robot-side client for ``python -m dit4dit_npu.serve`` (openpi-compatible wire format).

Imports only numpy, msgpack and websockets, never torch, so it runs on a robot computer:

    from dit4dit_npu.serve.client import WebsocketClientPolicy

    policy = WebsocketClientPolicy("127.0.0.1", 8000)
    print(policy.get_server_metadata())  # camera_keys, image_size, action_dim, chunk_length ...
    out = policy.infer({"observation.images.cam_high": img, ..., "state": q, "instruction": "..."})
    actions = out["actions"]  # (chunk_length, action_dim) float32, robot units

An error reply from the server (bad input) raises ``ServerError`` with the server's one-line
message; the connection stays usable for the next call. The server reports errors as openpi's
does (a text frame), so openpi's own ``WebsocketClientPolicy`` works against it unchanged too,
raising ``RuntimeError`` with the same message.

Note: ``import dit4dit_npu`` itself is light (no torch); this module only touches
``dit4dit_npu.serve.msgpack_numpy`` and ``dit4dit_npu.errors``.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

import websockets.sync.client
from websockets.exceptions import InvalidMessage, InvalidURI

from dit4dit_npu.errors import DiT4DiTError
from dit4dit_npu.serve import msgpack_numpy

logger = logging.getLogger(__name__)

# Matches the server default (serve.DEFAULT_MAX_MESSAGE_BYTES); replies are small, but the
# metadata and action chunks of large configs should never hit a client-side cap.
_CLIENT_MAX_SIZE = 64 * 1024 * 1024


class ServerError(DiT4DiTError, RuntimeError):
    """The server refused the request (its text frame is the message); the connection lives on."""


class WebsocketClientPolicy:
    """Synchronous websocket client: ``infer(obs) -> {"actions": ndarray, "server_timing": {...}}``."""

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
        metadata = self._decode(ws.recv())
        return ws, metadata

    @staticmethod
    def _decode(message: str | bytes) -> dict[str, Any]:
        if isinstance(message, str):  # openpi's convention: errors come as text frames
            raise ServerError(message)
        reply = msgpack_numpy.unpackb(message)
        if not isinstance(reply, dict):
            raise ServerError(f"unexpected reply of type {type(reply).__name__}")
        return reply

    def get_server_metadata(self) -> dict[str, Any]:
        return self._metadata

    def infer(self, obs: dict[str, Any]) -> dict[str, Any]:
        """Send one observation, wait for its action chunk."""
        self._ws.send(msgpack_numpy.packb(obs))
        return self._decode(self._ws.recv())

    def close(self) -> None:
        self._stack.close()

    def __enter__(self) -> WebsocketClientPolicy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
