"""Policy server: ``python -m dit4dit_npu.serve --policy DIR [--host 127.0.0.1 --port 8000]``.

Wire format: websocket + msgpack with numpy arrays (``msgpack_numpy``, openpi's encoding).

1. On connect the server sends its metadata: what the policy expects (camera keys, image and
   frame sizes, state/action dims and widths, chunk length, the observation layouts and the
   DiT4DiT example layout it accepts), its instructions, batching and message-size limits.
2. Each message is answered in its own format (``protocol.py``): an observation (ours or
   openpi's, optional int ``seed``) -> ``{"actions": float32 (chunk, action_dim) robot units,
   "server_timing": {...}}``, refused with a one-line text frame as openpi's server reports
   errors; DiT4DiT's ``{"examples": [...]}`` -> its ``{"status": "ok", "data":
   {"normalized_actions"}}`` envelope, and its ``ping``. The connection stays open either way.
3. Requests arriving together are answered by one batched model call (``batching.py``).

Why this differs from the original server (SPEC A18, B10): inference runs on a worker thread,
so the event loop keeps answering pings and other clients while a batch is computed; requests
are validated against a fixed schema instead of being splatted into ``predict_action``; an
exception never kills the connection; the default bind is localhost; nothing is unpickled;
nothing non-finite is sent.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import errno
import http
import logging
import socket
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import websockets
import websockets.asyncio.server as ws_server

from dit4dit_npu.cli import entry_point, former_names, require
from dit4dit_npu.errors import DiT4DiTError
from dit4dit_npu.serve import msgpack_numpy, protocol
from dit4dit_npu.serve.batching import Batcher
from dit4dit_npu.serve.metadata import server_metadata
from dit4dit_npu.transforms.observation import Observation, concat_observations, parse_observation
from dit4dit_npu.transforms.policy_io import NonFiniteActionError

logger = logging.getLogger("dit4dit_npu.serve")

# 3 cameras x 480x640 RGB x a batch of 8 is ~22 MiB: comfortably under 32 MiB.
DEFAULT_MAX_MESSAGE_BYTES = 32 * 1024 * 1024
# Messages above the limit but below this multiple are read and answered with an error; bigger
# ones are refused by the websocket layer (close code 1009) so they are never buffered.
_HARD_CAP_FACTOR = 4
# Requests smaller than this (e.g. three 224x224 views) are decoded and validated on the event
# loop; bigger ones (camera-size images to resize) on a helper thread.
_INLINE_BYTES = 512 * 1024
DEFAULT_MAX_BATCH = 8
DEFAULT_BATCH_WINDOW_MS = 5.0
# Instructions no training episode used are encoded on first use and kept, least recently used
# dropped beyond this many: each embedding is ~100 MB at full size.
DEFAULT_MAX_NEW_INSTRUCTIONS = 8
ROBOT, NORMALIZED = "robot", "normalized"  # the two kinds of model call (batch keys)


class ServablePolicy(Protocol):
    """What the server needs from a policy (DiT4DiTPolicy satisfies it)."""

    io: Any  # PolicyIO: cameras, sizes, widths
    max_added_instructions: int | None

    @property
    def metadata(self) -> dict[str, Any]: ...

    def predict_action(self, obs: dict[str, Any], seed: int | None = None) -> np.ndarray: ...

    def predict_normalized(
        self, frames: np.ndarray, state: np.ndarray | None, instructions: list[str], seed: int | None = None
    ) -> np.ndarray: ...


class ServeError(DiT4DiTError, RuntimeError):
    """The server cannot start (busy port, bad address); one line for the user."""


@dataclass
class _Pending:
    """A validated request waiting for the model, and how to phrase its answer."""

    kind: str  # ROBOT (openpi/ours) or NORMALIZED (DiT4DiT examples)
    payload: Observation | protocol.ModelInputs
    seed: int | None
    request_id: Any = None


class PolicyServer:
    """Serves one policy to any number of websocket clients, batching requests that arrive together."""

    def __init__(
        self,
        policy: ServablePolicy,
        host: str = "127.0.0.1",
        port: int = 8000,
        *,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        max_batch: int = DEFAULT_MAX_BATCH,
        batch_window_ms: float = DEFAULT_BATCH_WINDOW_MS,
        max_new_instructions: int | None = DEFAULT_MAX_NEW_INSTRUCTIONS,
        refuse_new_instructions: bool = False,
        input_errors: tuple[type[BaseException], ...] = (ValueError,),
    ) -> None:
        self._policy = policy
        self._host = host
        self._port = port
        self._max_bytes = max_message_bytes
        # Exceptions whose message is the user's answer (bad input: the policy raises ValueError
        # subclasses); anything else is logged with its traceback and reported as internal.
        self._input_errors = input_errors
        io = policy.io
        self._cameras = list(io.camera_keys)
        self._model_space = protocol.ModelSpace(io.frame_size, io.spec.state_width, _layout_text(io))
        # The training instructions: with refuse_new_instructions nothing else is accepted, so the
        # prompt cache (and memory) can never grow from the network.
        self._known = set(policy.metadata["instructions"]) if refuse_new_instructions else None
        if max_new_instructions is not None and not refuse_new_instructions:
            policy.max_added_instructions = max_new_instructions
        self._metadata = server_metadata(
            policy.metadata, io,
            max_message_bytes=max_message_bytes, max_batch=max_batch, batch_window_ms=batch_window_ms,
            new_instructions="refused" if refuse_new_instructions else max_new_instructions,
        )
        # One inference worker: the model is not re-entrant and one device computes one call at a
        # time. Decoding and validation run on their own threads, beside a running model call.
        self._infer_pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="infer")
        self._prep_pool = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="prepare")
        self._connections = 0
        self._batcher = Batcher(
            self._run_batch, self._infer_pool, max_batch=max_batch, window_s=batch_window_ms / 1e3,
            open_connections=lambda: self._connections,
        )
        self._server: ws_server.Server | None = None

    @property
    def port(self) -> int:
        """The bound port (useful with port=0)."""
        if self._server is None:
            return self._port
        return self._server.sockets[0].getsockname()[1]

    async def start(self) -> None:
        try:
            self._server = await ws_server.serve(
                self._handler,
                self._host,
                self._port,
                compression=None,  # images are incompressible; deflate only costs latency
                max_size=self._max_bytes * _HARD_CAP_FACTOR,
                process_request=_health_check,
            )
        except OSError as e:
            raise ServeError(_bind_problem(self._host, self._port, e)) from None
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
        await self._batcher.stop()
        # Do not block the event loop on a running inference; it finishes on its own thread.
        self._infer_pool.shutdown(wait=False, cancel_futures=True)
        self._prep_pool.shutdown(wait=False, cancel_futures=True)

    async def _handler(self, ws: ws_server.ServerConnection) -> None:
        logger.info("connection from %s", ws.remote_address)
        self._connections += 1
        try:
            await ws.send(msgpack_numpy.packb(self._metadata))
            async for message in ws:
                reply = await self._reply(message)
                await ws.send(reply if isinstance(reply, str) else msgpack_numpy.packb(reply))
        except websockets.ConnectionClosed:
            pass
        finally:
            self._connections -= 1
        logger.info("connection from %s closed", ws.remote_address)

    async def _reply(self, message: str | bytes) -> dict[str, Any] | str:
        """The answer to one message: a dict to pack, or a str (an openpi-style error frame)."""
        if isinstance(message, str):
            return "expected a binary msgpack message, got a text frame"
        if len(message) > self._max_bytes:
            return (
                f"message of {len(message)} bytes exceeds the server limit of {self._max_bytes} bytes "
                "(send smaller images or start the server with a larger --max-message-mb)"
            )
        try:
            if len(message) < _INLINE_BYTES:  # cheap: a thread hop would cost more than it saves
                prepared = self._prepare(message)
            else:  # decoding and resizing big images must not stall the event loop
                prepared = await asyncio.get_running_loop().run_in_executor(self._prep_pool, self._prepare, message)
        except self._input_errors as e:
            return _one_line(e)
        except Exception as e:
            logger.error("request validation failed", exc_info=e)
            return f"internal error: {_one_line(e)}"
        if not isinstance(prepared, _Pending):
            return prepared
        try:
            rows = prepared.payload.rows
            result, timing = await self._batcher.submit((prepared.kind, prepared.seed), prepared.payload, rows)
        except Exception as e:
            expected = isinstance(e, (*self._input_errors, NonFiniteActionError))  # the client's answer
            text = _one_line(e) if expected else f"internal error: {_one_line(e)}"
            if not expected:
                logger.error("inference failed", exc_info=e)
            if prepared.kind == NORMALIZED:
                return protocol.dit4dit_error(prepared.request_id, text)
            return text
        if prepared.kind == NORMALIZED:
            return protocol.dit4dit_result(prepared.request_id, result)
        return {"actions": np.asarray(result, dtype=np.float32), "server_timing": timing.as_dict()}

    # ------------------------------------------------------------------ validation (prep threads)

    def _prepare(self, message: bytes) -> _Pending | dict[str, Any]:
        """Decode and validate one request alone: a request for the model, or an immediate reply."""
        msg = msgpack_numpy.unpackb(message)
        if not isinstance(msg, dict):
            raise protocol.RequestError(f"expected an observation dict, got {type(msg).__name__}")
        if protocol.OPENPI_CTRL in msg:
            return protocol.openpi_ack(msg[protocol.OPENPI_CTRL])
        if protocol.is_dit4dit(msg):
            return self._prepare_dit4dit(msg)
        obs = dict(msg)
        seed = protocol.parse_seed(obs.pop("seed", None))
        io = self._policy.io
        # Exactly the policy's own parsing (PolicyIO.encode_observation): same checks, same resize.
        parsed = parse_observation(obs, self._cameras, io.image_size, io.state_dim, io.source_sizes, io.resize_method)
        self._check_instructions(parsed.instructions)
        return _Pending(ROBOT, parsed, seed)

    def _prepare_dit4dit(self, msg: dict[Any, Any]) -> _Pending | dict[str, Any]:
        rid = msg.get("request_id", "default")
        try:
            kind, inputs, seed = protocol.parse_dit4dit(msg, self._model_space)
            if inputs is None:
                return protocol.dit4dit_ping(rid)
            self._check_instructions(inputs.instructions)
        except protocol.RequestError as e:
            known = msg.get("type", "infer") in (*protocol.DIT4DIT_INFER, protocol.DIT4DIT_PING)
            return protocol.dit4dit_error(rid, str(e), "inference_result" if known else "unknown")
        return _Pending(NORMALIZED, inputs, seed, rid)

    def _check_instructions(self, instructions: Sequence[str]) -> None:
        if self._known is None:
            return
        new = [s for s in dict.fromkeys(instructions) if s not in self._known]
        if new:
            raise protocol.RequestError(
                f"instruction {new[0]!r} is not one the policy was trained with, and this server refuses new "
                f"instructions (--refuse-new-instructions); use one of {sorted(self._known)[:5]}"
            )

    # ------------------------------------------------------------------ model calls (worker thread)

    def _run_batch(self, key: tuple[str, int | None], payloads: Sequence[Any]) -> list[np.ndarray]:
        """One model call for requests of the same kind and seed -> one result per request."""
        kind, seed = key
        if kind == ROBOT:
            merged = payloads[0] if len(payloads) == 1 else concat_observations(payloads)
            out = self._policy.predict_action(merged.to_dict(self._cameras), seed=seed)
            results = [out] if len(payloads) == 1 else _split(out, payloads)
        else:
            merged = payloads[0] if len(payloads) == 1 else protocol.concat_model_inputs(payloads)
            out = self._policy.predict_normalized(merged.frames, merged.state, merged.instructions, seed=seed)
            results = _split(out, [_Batched(p.rows) for p in payloads])
        for r in results:  # nothing non-finite reaches a robot, whatever the policy did
            if not np.isfinite(r).all():
                raise NonFiniteActionError(
                    "the policy produced non-finite actions (NaN or inf) for this observation; nothing was sent"
                )
        return results


@dataclass
class _Batched:
    rows: int
    batched: bool = True


def _split(out: np.ndarray, parts: Sequence[Any]) -> list[np.ndarray]:
    """Batched output rows -> one result per request (a single-observation request gets no batch axis)."""
    results, start = [], 0
    for p in parts:
        rows = out[start : start + p.rows]
        results.append(rows if p.batched else rows[0])
        start += p.rows
    return results


def _layout_text(io: Any) -> str:
    h, w = io.image_size
    return f"views {', '.join(io.camera_keys)} each {h}x{w}, tiled by {io.view_layout!r}"


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return text if isinstance(e, ValueError) else f"{type(e).__name__}: {text}"


def _bind_problem(host: str, port: int, e: OSError) -> str:
    if e.errno == errno.EADDRINUSE:
        return f"cannot listen on {host}:{port}: the port is already in use (another server? choose another --port)"
    return f"cannot listen on {host}:{port}: {e.strerror or e}"


def check_port(host: str, port: int) -> None:
    """Fail before the (minutes-long at full size) model load if the port cannot be bound."""
    if port == 0:
        return
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as asyncio binds
            s.bind(addr)
    except socket.gaierror as e:
        raise ServeError(f"cannot listen on {host}:{port}: unknown host ({e.strerror})") from None
    except OSError as e:
        raise ServeError(_bind_problem(host, port, e)) from None


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
        description="Serve an exported DiT4DiT policy over websocket + msgpack (openpi wire format; "
        "DiT4DiT's own {'examples': [...]} requests too).",
    )
    policy = p.add_argument("--policy", help="exported policy folder (contains policy.json; required)")
    former_names(p, policy, "--checkpoint")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default: localhost only)")
    p.add_argument("--port", type=int, default=8000, help="TCP port (0 = any free port)")
    p.add_argument("--base-model", default=None, help="override the base model path recorded at export")
    p.add_argument("--bf16", action="store_true", help="cast the video backbone to bf16 (accelerators)")
    p.add_argument("--merge-lora", action="store_true", help="fold a LoRA policy's adapter into the base transformer at load (no adapter cost per step)")
    p.add_argument("--max-message-mb", type=float, default=DEFAULT_MAX_MESSAGE_BYTES / 2**20,
                   help="largest request answered, in MiB (default: %(default)g); bigger ones get an error")
    p.add_argument("--max-batch", type=int, default=DEFAULT_MAX_BATCH,
                   help="most observation rows answered by one model call (default: %(default)d; "
                   "1 = one request at a time)")
    p.add_argument("--batch-window-ms", type=float, default=DEFAULT_BATCH_WINDOW_MS,
                   help="how long the first request of a batch waits for others to join (default: %(default)g)")
    p.add_argument("--max-new-instructions", type=int, default=DEFAULT_MAX_NEW_INSTRUCTIONS,
                   help="instructions outside the training set kept encoded, least recently used dropped "
                   "(default: %(default)d; each is ~100 MB at full size)")
    p.add_argument("--refuse-new-instructions", action="store_true",
                   help="answer only the instructions the policy was trained with")
    p.add_argument("--log-level", default="INFO", help="DEBUG, INFO (default), WARNING or ERROR")
    args = p.parse_args(argv)
    require(p, args, policy)
    for name, low in (("max_batch", 1), ("max_new_instructions", 0)):
        if getattr(args, name) < low:
            p.error(f"--{name.replace('_', '-')} must be >= {low}, got {getattr(args, name)}")
    if args.batch_window_ms < 0 or args.max_message_mb <= 0:
        p.error("--batch-window-ms must be >= 0 and --max-message-mb > 0")
    if not 0 <= args.port <= 65535:  # else bind() raises OverflowError after the argument checks
        p.error(f"--port must be in 0..65535, got {args.port}")
    if args.log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        p.error(f"--log-level must be DEBUG, INFO, WARNING or ERROR, got {args.log_level!r}")
    return args


@entry_point
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        check_port(args.host, args.port)
    except ServeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    import torch  # only once we need it

    from dit4dit_npu.policy import DiT4DiTPolicy, PolicyLoadError

    t0 = time.perf_counter()
    try:
        policy = DiT4DiTPolicy.from_pretrained(
            args.policy, base_model=args.base_model, backbone_dtype=torch.bfloat16 if args.bf16 else None,
            merge_lora=args.merge_lora,
        )
    except PolicyLoadError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    logger.info("policy loaded in %.1f s", time.perf_counter() - t0)
    server = PolicyServer(
        policy, args.host, args.port, max_message_bytes=int(args.max_message_mb * 2**20),
        max_batch=args.max_batch, batch_window_ms=args.batch_window_ms,
        max_new_instructions=args.max_new_instructions, refuse_new_instructions=args.refuse_new_instructions,
    )
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        logger.warning("binding %s: the server has no authentication; expose it on trusted networks only",
                       args.host)
    try:
        asyncio.run(server.serve_forever())
    except ServeError as e:  # the port was taken while the model loaded
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        pass
    return 0
