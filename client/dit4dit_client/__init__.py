"""dit4dit-client: the robot side of a dit4dit-npu policy server, without torch.

    wire format     ``msgpack_numpy``: openpi's msgpack encoding of numpy arrays (the one definition;
                    the server imports it from here)
    clients         ``WebsocketClientPolicy`` (ours and openpi's observation layouts, real-time
                    chunking sessions), ``Dit4DitClient`` (DiT4DiT's own model-space protocol)
    checks          ``checks``: replies refused before they reach a robot (no actions, the wrong
                    shape, NaN/inf), requests refused before they are sent (seed range, values
                    msgpack cannot carry); every call has a deadline (``DEFAULT_REQUEST_TIMEOUT_S``)
    execution       ``ChunkExecutor`` (sync / async / temporal ensembling / RTC merging of chunks
                    on a control-step clock) and ``AsyncChunkRunner`` (the real-time loop)

Depends on numpy, msgpack and websockets only.
"""

from dit4dit_client.chunking import MODES, ChunkExecutor, ChunkRequest, delay_steps
from dit4dit_client.errors import (
    ArgumentError,
    BadReplyError,
    ClientError,
    ConnectionLostError,
    RequestError,
    ServerTimeoutError,
    ServerUnreachableError,
)
from dit4dit_client.msgpack_numpy import WireFormatError
from dit4dit_client.runtime import AsyncChunkRunner, RunStats, websocket_infer
from dit4dit_client.websocket_client import (
    DEFAULT_REQUEST_TIMEOUT_S,
    Dit4DitClient,
    ServerError,
    WebsocketClientPolicy,
)

__all__ = [
    "DEFAULT_REQUEST_TIMEOUT_S",
    "MODES",
    "ArgumentError",
    "AsyncChunkRunner",
    "BadReplyError",
    "ChunkExecutor",
    "ClientError",
    "ConnectionLostError",
    "ChunkRequest",
    "Dit4DitClient",
    "RequestError",
    "RunStats",
    "ServerError",
    "ServerTimeoutError",
    "ServerUnreachableError",
    "WebsocketClientPolicy",
    "WireFormatError",
    "delay_steps",
    "websocket_infer",
]
