"""Helpers shared by the server tests: a real PolicyServer on 127.0.0.1 in a background event
loop, a delaying policy wrapper, concurrent real clients, and a client that speaks DiT4DiT's
own protocol (written from its message format: ``{"examples": [...]}`` in, the ``{"status",
"data": {"normalized_actions"}}`` envelope out)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import websockets.sync.client
from dit4dit_client import ServerError, WebsocketClientPolicy, msgpack_numpy

from dit4dit_npu.serve.server import PolicyServer

TIMEOUT = 30.0  # every wait is bounded: a hang is a failure, not a stuck CI job


class RunningServer:
    """PolicyServer on port 0 in a background event loop."""

    def __init__(self, policy: Any, **kwargs: Any) -> None:
        self.loop = asyncio.new_event_loop()
        self.server = PolicyServer(policy, "127.0.0.1", 0, **kwargs)
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> RunningServer:
        self.thread.start()
        self.call(self.server.start())
        return self

    def __exit__(self, *exc: object) -> None:
        self.call(self.server.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(TIMEOUT)
        self.loop.close()

    def call(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(TIMEOUT)

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
    """The real policy with an injected delay in front of every robot-unit inference."""

    def __init__(self, policy: Any, delay_s: float) -> None:
        self.policy, self.delay_s = policy, delay_s

    def __getattr__(self, name: str) -> Any:
        return getattr(self.policy, name)

    def predict_batch(self, requests: Any, seed: int | None = None, **kwargs: Any) -> list[np.ndarray]:
        time.sleep(self.delay_s)
        return self.policy.predict_batch(requests, seed=seed, **kwargs)


def concurrently(server: RunningServer, requests: list[dict[str, Any]], rounds: int = 1) -> list[list[Any]]:
    """One connected client per request; all send at once (``rounds`` times); per request the
    replies, or the ServerError a refused request raised."""
    clients = [server.client() for _ in requests]  # all connected before anyone sends
    start = threading.Barrier(len(requests))

    def session(i: int) -> list[Any]:
        start.wait(TIMEOUT)
        out: list[Any] = []
        for _ in range(rounds):
            try:
                out.append(clients[i].infer(requests[i]))
            except ServerError as e:
                out.append(e)
        return out

    try:
        with ThreadPoolExecutor(len(requests)) as pool:
            return list(pool.map(session, range(len(requests)), timeout=TIMEOUT * 4))
    finally:
        for c in clients:
            c.close()


class Dit4DitProtocolClient:
    """A robot-side client as DiT4DiT's LIBERO / RoboCasa clients talk: send the query dict,
    raise on a text frame, return the decoded envelope."""

    def __init__(self, uri: str) -> None:
        self._stack = contextlib.ExitStack()
        self._ws = self._stack.enter_context(
            websockets.sync.client.connect(uri, compression=None, max_size=None, open_timeout=TIMEOUT, proxy=None)
        )
        self.metadata = msgpack_numpy.unpackb(self._ws.recv(timeout=TIMEOUT))

    def predict_action(self, query: dict[str, Any]) -> dict[str, Any]:
        self._ws.send(msgpack_numpy.packb(query))
        reply = self._ws.recv(timeout=TIMEOUT)
        if isinstance(reply, str):
            raise RuntimeError(f"Error in inference server:\n{reply}")
        return msgpack_numpy.unpackb(reply)

    def close(self) -> None:
        self._stack.close()


def dit4dit_example(obs: dict[str, Any], camera_keys: list[str], state_min: np.ndarray, state_max: np.ndarray
                    ) -> dict[str, Any]:
    """An example as a DiT4DiT client builds it for a min-max state policy: the views (already at
    the model's view size) side by side along width, the state min-max normalized by the client
    itself (degenerate dims to 0), shape (1, S)."""
    frame = np.concatenate([obs[k] for k in camera_keys], axis=1)
    span = state_max - state_min
    state = np.where(span > 0, 2 * (obs["state"] - state_min) / np.where(span > 0, span, 1) - 1, 0.0)
    return {"image": [frame], "lang": obs["instruction"], "state": state[None].astype(np.float32),
            "wrist_image": obs[camera_keys[1]]}  # the LIBERO client leaves this in: ignored


def load_policy(**kwargs: Any) -> Any:
    from policy_fixtures import shared_tiny_setup

    from dit4dit_npu.policy import DiT4DiTPolicy

    return DiT4DiTPolicy.from_pretrained(shared_tiny_setup().policy_dir, **kwargs)


def sample_observations(policy: Any, n: int = 8) -> list[dict[str, Any]]:
    """``n`` different held-out observations, as a robot sends them."""
    from policy_fixtures import observation_from_sample, shared_tiny_setup

    ds = shared_tiny_setup().data.val_dataset
    step = max(1, len(ds) // n)
    return [observation_from_sample(policy.camera_keys, ds.raw_sample(i * step)) for i in range(n)]


def in_training_range(policy: Any, chunk: np.ndarray) -> np.ndarray:
    """``chunk`` clipped to the training action range: the tiny test policy is untrained, so its
    own chunks stray past that range, where a prev_chunk a robot sends is refused."""
    stats = policy.io.stats["action"]
    return np.clip(chunk, stats.min, stats.max).astype(np.float32)


def own_chunk_action(policy: Any, obs: dict[str, Any], seed: int, prev_chunk: np.ndarray, **rtc: Any) -> np.ndarray:
    """The policy's RTC call onto the rest of a chunk it returned itself, as a server's session
    makes it (``own_chunk``: not range-checked), through the server's interface."""
    from dit4dit_npu.policy import RTCRequest

    parsed = policy.with_rtc(policy.parse(obs), RTCRequest(prev_chunk, own_chunk=True, **rtc))
    return policy.predict_batch([parsed], seed=seed)[0]
