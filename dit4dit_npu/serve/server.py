"""Policy server: ``python -m dit4dit_npu.serve --checkpoint DIR [--host 127.0.0.1 --port 8000]``.

Wire format (openpi-compatible, see ``msgpack_numpy``):

1. On connect the server sends its metadata: camera keys, image size, state/action dims, chunk
   length, the training step, and the message-size limit.
2. The client sends an observation dict ``{camera_key: uint8 HWC image, "state": (state_dim,),
   "instruction": str}`` (``"prompt"`` is accepted for ``"instruction"``, an optional int
   ``"seed"`` makes the reply deterministic; batched inputs carry a leading batch axis).
3. The server replies ``{"actions": float32 (chunk, action_dim) in robot units,
   "server_timing": {"infer_ms", "queue_ms"}}`` or, for any bad request, ``{"error": "..."}``;
   the connection stays open either way. openpi's ``{"__ctrl__": ...}`` messages are acknowledged.

Why this differs from the original server (SPEC A18, B10): inference runs on one worker thread,
so the event loop keeps answering pings and other clients while a request is computed; the
request is validated against a fixed schema instead of being splatted into ``predict_action``;
an exception never kills the connection; the default bind is localhost; nothing is unpickled.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import http
import logging
import sys
import time
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
import websockets
import websockets.asyncio.server as ws_server

from dit4dit_npu.serve import msgpack_numpy

logger = logging.getLogger("dit4dit_npu.serve")

# 3 cameras x 480x640 RGB x a batch of 8 is ~22 MiB: comfortably under 32 MiB.
DEFAULT_MAX_MESSAGE_BYTES = 32 * 1024 * 1024
# Messages above the limit but below this multiple are read and answered with an error; bigger
# ones are refused by the websocket layer (close code 1009) so they are never buffered.
_HARD_CAP_FACTOR = 4


class ServablePolicy(Protocol):
    """What the server needs from a policy (DiT4DiTPolicy satisfies it)."""

    @property
    def metadata(self) -> dict[str, Any]: ...

    def predict_action(self, obs: dict[str, Any], seed: int | None = None) -> np.ndarray: ...


class PolicyServer:
    """Serves one policy to any number of websocket clients, one inference at a time."""

    def __init__(
        self,
        policy: ServablePolicy,
        host: str = "127.0.0.1",
        port: int = 8000,
        *,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        input_errors: tuple[type[BaseException], ...] = (ValueError,),
    ) -> None:
        self._policy = policy
        self._host = host
        self._port = port
        self._max_bytes = max_message_bytes
        # Exceptions whose message is the user's answer (bad input: the policy raises ValueError
        # subclasses); anything else is logged with its traceback and reported as internal.
        self._input_errors = input_errors
        self._metadata = {**policy.metadata, "max_message_bytes": max_message_bytes}
        # One worker: the model is not re-entrant and one device computes one request at a time
        # anyway; the queue is FIFO, so concurrent clients are served in arrival order.
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="infer")
        self._server: ws_server.Server | None = None

    @property
    def port(self) -> int:
        """The bound port (useful with port=0)."""
        if self._server is None:
            return self._port
        return self._server.sockets[0].getsockname()[1]

    async def start(self) -> None:
        self._server = await ws_server.serve(
            self._handler,
            self._host,
            self._port,
            compression=None,  # images are incompressible; deflate only costs latency
            max_size=self._max_bytes * _HARD_CAP_FACTOR,
            process_request=_health_check,
        )
        logger.info("serving on ws://%s:%d", self._host, self.port)

    async def serve_forever(self) -> None:
        if self._server is None:
            await self.start()
        assert self._server is not None
        await self._server.serve_forever()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        # Do not block the event loop on a running inference; it finishes on its own thread.
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def _handler(self, ws: ws_server.ServerConnection) -> None:
        logger.info("connection from %s", ws.remote_address)
        try:
            await ws.send(msgpack_numpy.packb(self._metadata))
            async for message in ws:
                reply = await self._reply(message)
                await ws.send(msgpack_numpy.packb(reply))
        except websockets.ConnectionClosed:
            pass
        logger.info("connection from %s closed", ws.remote_address)

    async def _reply(self, message: str | bytes) -> dict[str, Any]:
        if isinstance(message, str):
            return _error("expected a binary msgpack message, got a text frame")
        if len(message) > self._max_bytes:
            return _error(
                f"message of {len(message)} bytes exceeds the server limit of {self._max_bytes} bytes "
                "(send smaller images or start the server with a larger --max-message-mb)"
            )
        try:
            obs = msgpack_numpy.unpackb(message)
        except msgpack_numpy.WireFormatError as e:
            return _error(str(e))
        if not isinstance(obs, dict):
            return _error(f"expected an observation dict, got {type(obs).__name__}")
        if "__ctrl__" in obs:  # openpi episode bookkeeping: nothing to do for a stateless policy
            return {"__ack__": obs["__ctrl__"]}
        obs = dict(obs)
        seed = obs.pop("seed", None)
        if seed is not None and (not isinstance(seed, int | np.integer) or isinstance(seed, bool)):
            return _error(f"seed must be an int, got {type(seed).__name__}")
        t_submit = time.perf_counter()
        try:
            actions, infer_s = await asyncio.get_running_loop().run_in_executor(
                self._executor, _timed, self._policy.predict_action, obs, None if seed is None else int(seed)
            )
        except self._input_errors as e:
            return _error(str(e))
        except Exception as e:
            logger.exception("inference failed")
            return _error(f"internal error: {type(e).__name__}: {e}")
        total_s = time.perf_counter() - t_submit
        return {
            "actions": np.asarray(actions, dtype=np.float32),
            "server_timing": {"infer_ms": infer_s * 1e3, "queue_ms": max(0.0, total_s - infer_s) * 1e3},
        }


def _timed(fn: Callable[..., np.ndarray], obs: dict[str, Any], seed: int | None) -> tuple[np.ndarray, float]:
    t0 = time.perf_counter()
    out = fn(obs, seed=seed)
    return out, time.perf_counter() - t0


def _error(text: str) -> dict[str, Any]:
    return {"error": text}


def _health_check(connection: ws_server.ServerConnection, request: ws_server.Request) -> Any:
    """``GET /healthz`` -> 200 (for load balancers / scripts waiting for the model to load)."""
    if request.path == "/healthz":
        return connection.respond(http.HTTPStatus.OK, "OK\n")
    return None


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m dit4dit_npu.serve",
        description="Serve an exported DiT4DiT policy over websocket + msgpack (openpi wire format).",
    )
    p.add_argument("--checkpoint", required=True, help="exported policy folder (contains policy.json)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default: localhost only)")
    p.add_argument("--port", type=int, default=8000, help="TCP port (0 = any free port)")
    p.add_argument("--base-model", default=None, help="override the base model path recorded at export")
    p.add_argument("--bf16", action="store_true", help="cast the video backbone to bf16 (accelerators)")
    p.add_argument(
        "--max-message-mb",
        type=float,
        default=DEFAULT_MAX_MESSAGE_BYTES / 2**20,
        help="largest observation message answered, in MiB (default: %(default)g); bigger ones get an error",
    )
    p.add_argument("--log-level", default="INFO", help="DEBUG, INFO (default), WARNING or ERROR")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    import torch  # only once we need it: the module itself stays importable without torch

    from dit4dit_npu.policy import DiT4DiTPolicy, PolicyLoadError

    try:
        policy = DiT4DiTPolicy.from_pretrained(
            args.checkpoint, base_model=args.base_model, backbone_dtype=torch.bfloat16 if args.bf16 else None
        )
    except PolicyLoadError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    server = PolicyServer(
        policy, args.host, args.port, max_message_bytes=int(args.max_message_mb * 2**20)
    )
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        logger.warning("binding %s: the server has no authentication; expose it on trusted networks only",
                       args.host)
    try:
        asyncio.run(server.serve_forever())
    except KeyboardInterrupt:
        pass
    return 0

