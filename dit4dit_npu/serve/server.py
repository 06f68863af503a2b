"""Policy server (its command line: ``cli.py``, ``python -m dit4dit_npu.serve --policy DIR``).

Wire format: websocket + msgpack with numpy arrays (``msgpack_numpy``, openpi's encoding).

1. On connect the server sends its metadata: what the policy expects (camera keys, image and
   frame sizes, state/action dims and widths, chunk length, the observation layouts and the
   DiT4DiT example layout it accepts), its instructions, batching and message-size limits.
2. Each message is answered by the handler of its kind (``handlers.py``; the formats are in
   ``protocol.py``): an observation (ours or openpi's, optional int ``seed``) -> ``{"actions":
   float32 (chunk, action_dim) robot units, "server_timing": {...}}``, refused with a one-line
   text frame as openpi's server reports errors; DiT4DiT's ``{"examples": [...]}`` -> its
   ``{"status": "ok", "data": {"normalized_actions"}}`` envelope, and its ``ping``; openpi's
   ``__ctrl__`` messages. The connection stays open either way.
3. Requests arriving together are answered by one batched model call (``batching.py``); real-time
   chunking requests batch with each other.
4. Each connection has a session (``session.py``): the last chunk sent on it, so an observation
   with ``"rtc": {"executed": s}`` is inpainted onto that chunk's rest without resending it.
   It is dropped when the connection closes.

5. A refusal's text says whose fault it is, decided by the exception's class (``REFUSALS``;
   docs/serving.md lists the classes): the client's input (``RequestError``, ``PolicyInputError``
   and its subclasses) is answered with its one line as is; a result the policy will not return
   (``NonFiniteActionError``) with its class name and line; anything else is the server's own
   fault, answered "internal error: ..." with the traceback in the log.

Why this differs from the original server: inference runs on a worker thread,
so the event loop keeps answering pings and other clients while a batch is computed; requests
are validated against a fixed schema instead of being splatted into ``predict_action``; an
exception never kills the connection; the default bind is localhost; nothing is unpickled;
nothing non-finite is sent (the policy refuses to return it).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import errno
import http
import logging
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import websockets
import websockets.asyncio.server as ws_server
from dit4dit_client import msgpack_numpy

from dit4dit_npu.errors import DiT4DiTError
from dit4dit_npu.policy import NonFiniteActionError, PolicyInputError
from dit4dit_npu.serve.batching import Batcher
from dit4dit_npu.serve.handlers import (
    Call,
    Connection,
    Handler,
    Handlers,
    InstructionGate,
    Reply,
    ServablePolicy,
)
from dit4dit_npu.serve.metadata import server_metadata
from dit4dit_npu.serve.protocol import RequestError, RequestLimits
from dit4dit_npu.serve.session import Session

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
# A request's images once decoded and resized may take this multiple of the message cap: room for
# a full message of camera-size images plus their frames at the model size.
DECODED_PER_MESSAGE_BYTE = 2
DEFAULT_BATCH_WINDOW_MS = 5.0
# Instructions no training episode used are encoded on first use and kept, least recently used
# dropped beyond this many: each embedding is ~100 MB at full size. The policy holds the cap
# (``from_pretrained(..., max_added_instructions=N)``); this is what the command line loads it with.
DEFAULT_MAX_NEW_INSTRUCTIONS = 8

# Whose fault a refusal is, by class (every subclass included): the client's input, answered with
# its own line; or a result the policy will not return, answered with its class and line. Any
# other exception is the server's fault ("internal error: ...", traceback in the log), whatever its
# builtin base: a ValueError from deeper in the stack is a bug, not the client's mistake.
CLIENT_ERRORS: tuple[type[DiT4DiTError], ...] = (RequestError, PolicyInputError)
POLICY_REFUSALS: tuple[type[DiT4DiTError], ...] = (NonFiniteActionError,)
REFUSALS = CLIENT_ERRORS + POLICY_REFUSALS


class ServeError(DiT4DiTError, RuntimeError):
    """The server cannot start (busy port, bad address); one line for the user."""


@dataclass(frozen=True)
class _Request:
    """A checked request waiting for the model, with what its handler needs to phrase the answer."""

    handler: Handler
    msg: dict[Any, Any]
    call: Call


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
        refuse_new_instructions: bool = False,
        max_rows: int | None = None,
        max_decoded_bytes: int | None = None,
        allow_out_of_range: bool = False,
        allow_out_of_range_state: bool | None = None,
    ) -> None:
        """``max_rows`` (default ``max_batch``) and ``max_decoded_bytes`` (default
        ``DECODED_PER_MESSAGE_BYTE`` x ``max_message_bytes``) cap one request, checked before it is
        decoded and resized; ``allow_out_of_range`` answers states and RTC ``prev_chunk``s far outside
        the training range (refused by default) with a warning in the reply
        (``allow_out_of_range_state``: its former name). The cap on new instructions is the
        policy's own (``max_added_instructions``, given when it was loaded): the server reports it
        and never changes the policy."""
        if allow_out_of_range_state is not None:
            allow_out_of_range = allow_out_of_range or allow_out_of_range_state
        self._host = host
        self._port = port
        self._max_bytes = max_message_bytes
        description = policy.describe()
        known = frozenset(description.instructions) if refuse_new_instructions else None
        limits = RequestLimits(
            max_rows=max_batch if max_rows is None else max_rows,
            max_decoded_bytes=DECODED_PER_MESSAGE_BYTE * max_message_bytes if max_decoded_bytes is None else max_decoded_bytes,
        )
        self._handlers = Handlers.for_policy(policy, InstructionGate(known), limits, allow_out_of_range)
        cap = policy.max_added_instructions
        if cap is None and not refuse_new_instructions:
            logger.warning("the policy has no cap on instructions added at run time (loaded without "
                           "max_added_instructions): clients can grow its prompt cache without bound")
        self._metadata = server_metadata(
            description,
            max_message_bytes=max_message_bytes, max_batch=max_batch, batch_window_ms=batch_window_ms,
            new_instructions="refused" if refuse_new_instructions else cap,
            limits=limits, out_of_range_state="answered with warnings" if allow_out_of_range else "refused",
        )
        # One inference worker: the model is not re-entrant and one device computes one call at a
        # time. Decoding and validation run on their own threads, beside a running model call.
        self._infer_pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="infer")
        self._prep_pool = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="prepare")
        self._connections: set[Connection] = set()  # open ones; each holds its session
        self._batcher = Batcher(
            self._run_batch, self._infer_pool, max_batch=max_batch, window_s=batch_window_ms / 1e3,
            open_connections=lambda: len(self._connections),
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
                self._serve_connection,
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

    @property
    def sessions(self) -> list[Session]:
        """The sessions of the open connections (a closed connection's is dropped with it)."""
        return [c.session for c in self._connections if c.session is not None]

    async def _serve_connection(self, ws: ws_server.ServerConnection) -> None:
        logger.info("connection from %s", ws.remote_address)
        conn = Connection(ws.remote_address)
        self._connections.add(conn)
        try:
            await ws.send(msgpack_numpy.packb(self._metadata))
            async for message in ws:
                try:
                    reply = await self._answer(message, conn)
                except Exception as e:  # a bug in answering one request must not drop the robot
                    reply = self._error_text(e, "answering a request")
                await ws.send(reply if isinstance(reply, str) else msgpack_numpy.packb(reply))
        except websockets.ConnectionClosed:
            pass
        finally:
            self._connections.discard(conn)
            conn.close()  # its previous chunk and latencies go with it
        logger.info("connection from %s closed", ws.remote_address)

    async def _answer(self, message: str | bytes, conn: Connection) -> Reply:
        """The answer to one message: a dict to pack, or a str (an openpi-style error frame)."""
        if isinstance(message, str):
            return refusal_text(RequestError("expected a binary msgpack message, got a text frame"))
        if len(message) > self._max_bytes:
            return refusal_text(RequestError(
                f"message of {len(message)} bytes exceeds the server limit of {self._max_bytes} bytes "
                "(send smaller images or start the server with a larger --max-message-mb)"
            ))
        if len(message) < _INLINE_BYTES:  # cheap: a thread hop would cost more than it saves
            prepared = self._prepare(message, conn)
        else:  # decoding and resizing big images must not stall the event loop
            prepared = await asyncio.get_running_loop().run_in_executor(self._prep_pool, self._prepare, message, conn)
        if not isinstance(prepared, _Request):
            return prepared
        handler, msg, call = prepared.handler, prepared.msg, prepared.call
        try:
            result, timing = await self._batcher.submit((handler, call.seed, call.group), call.payload, call.rows)
        except Exception as e:
            return handler.error(msg, self._error_text(e, "inference"))
        reply = handler.reply(msg, result, timing, conn)
        if call.warnings and isinstance(reply, dict):
            reply = {**reply, "warnings": list(call.warnings)}
        return reply

    def _prepare(self, message: bytes, conn: Connection) -> _Request | Reply:
        """Decode one request and have its handler check it alone: a request for the model, or
        the reply. Runs on a helper thread for big messages."""
        try:
            try:
                msg = msgpack_numpy.unpackb(message)
            except msgpack_numpy.WireFormatError as e:  # the client package's class: the client's fault
                raise RequestError(str(e)) from None
            handler = self._handlers.find(msg)
        except Exception as e:  # not even a message of a known kind: answered as openpi does
            return self._error_text(e, "request decoding")
        try:
            prepared = handler.prepare(msg, conn)
        except Exception as e:
            return handler.error(msg, self._error_text(e, "request validation"))
        return _Request(handler, msg, prepared) if isinstance(prepared, Call) else prepared

    def _error_text(self, e: BaseException, during: str) -> str:
        """The client's one line for an exception (see ``REFUSALS``)."""
        return refusal_text(e) if isinstance(e, REFUSALS) else _internal_error(e, during)

    def _run_batch(self, key: tuple[Handler, int | None, Any], payloads: Sequence[Any]) -> Sequence[Any]:
        """On the worker thread: one model call for requests of the same kind, seed and group."""
        handler, seed, _ = key
        return handler.run(payloads, seed)


def refusal_text(e: BaseException) -> str:
    """One line: the client's input error as its message, any other with its class name first."""
    text = " ".join(str(e).split())
    return text if isinstance(e, CLIENT_ERRORS) else f"{type(e).__name__}: {text}"


def _internal_error(e: BaseException, during: str) -> str:
    logger.error("%s failed", during, exc_info=e)
    return f"internal error: {refusal_text(e)}"


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
