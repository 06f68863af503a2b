"""Request kinds: one handler per kind of message the server answers, tried in a fixed order.

A handler owns everything about its kind, so the server never branches on it:

- ``claims(msg)``: is this decoded message mine? (the first handler of ``Handlers`` that claims
  it gets it);
- ``prepare(msg, conn)``: check it alone, before any batching -> a ``Call`` for the model, or
  an immediate reply (a ping, an acknowledgement). Raises on bad input;
- ``run(payloads, seed)``: on the inference thread, one model call for the ``Call`` payloads of
  its kind that arrived together with the same seed -> one result per payload;
- ``reply(msg, result, timing, conn)`` / ``error(msg, text)``: the answer in its clients' format.

Every method that sees a request gets the ``Connection`` it arrived on. A connection's messages
are handled one after another (the next is read only once this one is answered), so a handler may
keep per-connection state there without locks, even though ``prepare`` may run on a helper thread.

A reply is a dict (packed with msgpack) or a str (sent as a text frame: how openpi's server
reports errors, and its client raises with the text).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import numpy as np

from dit4dit_npu.serve import protocol
from dit4dit_npu.serve.batching import Timing
from dit4dit_npu.transforms.observation import Observation, concat_observations

Reply = dict[str, Any] | str


class ServablePolicy(Protocol):
    """What the handlers need from a policy (DiT4DiTPolicy satisfies it). Both predictions raise
    ``NonFiniteActionError`` rather than return NaN/inf: that check has one owner, the policy."""

    io: Any  # PolicyIO: parses observations; cameras, sizes, widths
    max_added_instructions: int | None

    @property
    def metadata(self) -> dict[str, Any]: ...

    def predict_parsed(self, observation: Observation, seed: int | None = None) -> np.ndarray: ...

    def predict_normalized(
        self, frames: np.ndarray, state: np.ndarray | None, instructions: list[str], seed: int | None = None
    ) -> np.ndarray: ...


@dataclass
class Connection:
    """One client connection, handed to every handler call for its requests. It holds only the
    peer's address so far: per-connection state (a real-time-chunking session's previous chunk
    and step counter) belongs here."""

    remote: Any = None


@dataclass(frozen=True)
class Call:
    """A checked request waiting for the model. Calls of the same handler and seed that arrive
    together share one model call (``batching.py``): a seeded call draws one noise for all its
    rows, so only equal seeds can share one and still get their single-call answers."""

    payload: Any  # what the handler's ``run`` takes: an Observation, protocol.ModelInputs
    seed: int | None

    @property
    def rows(self) -> int:
        return self.payload.rows


@dataclass(frozen=True)
class InstructionGate:
    """``known`` None: any instruction is accepted (new ones are encoded on first use). A set
    (``--refuse-new-instructions``): only those, so the prompt cache, and memory, can never grow
    from the network."""

    known: frozenset[str] | None = None

    def check(self, instructions: Sequence[str]) -> None:
        if self.known is None:
            return
        new = [s for s in dict.fromkeys(instructions) if s not in self.known]
        if new:
            raise protocol.RequestError(
                f"instruction {new[0]!r} is not one the policy was trained with, and this server refuses new "
                f"instructions (--refuse-new-instructions); use one of {sorted(self.known)[:5]}"
            )


class Handler(ABC):
    name: ClassVar[str]  # for logs and tests

    @abstractmethod
    def claims(self, msg: dict[Any, Any]) -> bool: ...

    @abstractmethod
    def prepare(self, msg: dict[Any, Any], conn: Connection) -> Call | Reply: ...

    @abstractmethod
    def error(self, msg: dict[Any, Any], text: str) -> Reply: ...

    # Only handlers whose ``prepare`` returns a Call are asked these two.
    def run(self, payloads: Sequence[Any], seed: int | None) -> list[np.ndarray]:
        raise NotImplementedError(f"{self.name} requests are answered without the model")

    def reply(self, msg: dict[Any, Any], result: np.ndarray, timing: Timing, conn: Connection) -> Reply:
        raise NotImplementedError(f"{self.name} requests are answered without the model")


# ------------------------------------------------------------------------------------ openpi


class OpenpiControl(Handler):
    """openpi's episode bookkeeping ``{"__ctrl__": ...}``, acknowledged as openpi's server does."""

    name = "openpi_control"

    def claims(self, msg: dict[Any, Any]) -> bool:
        return protocol.OPENPI_CTRL in msg

    def prepare(self, msg: dict[Any, Any], conn: Connection) -> Reply:
        return protocol.openpi_ack(msg[protocol.OPENPI_CTRL])

    def error(self, msg: dict[Any, Any], text: str) -> Reply:
        return text


class ObservationRequest(Handler):
    """A robot observation (ours or openpi's layout, single or batched, optional ``seed``) ->
    ``{"actions": float32 robot units, "server_timing"}``; errors as one-line text frames.

    Claims every dict no earlier handler claimed, so it must come last: a robot that sent a
    malformed observation is told which observation keys were expected."""

    name = "observation"

    def __init__(self, policy: ServablePolicy, gate: InstructionGate) -> None:
        self._policy, self._gate = policy, gate

    def claims(self, msg: dict[Any, Any]) -> bool:
        return True

    def prepare(self, msg: dict[Any, Any], conn: Connection) -> Call:
        obs = dict(msg)
        seed = protocol.parse_seed(obs.pop("seed", None))
        observation = self._policy.io.parse_observation(obs)  # the one parse (and resize) of it
        self._gate.check(observation.instructions)
        return Call(observation, seed)

    def run(self, payloads: Sequence[Observation], seed: int | None) -> list[np.ndarray]:
        if len(payloads) == 1:
            return [self._policy.predict_parsed(payloads[0], seed=seed)]
        out = self._policy.predict_parsed(concat_observations(payloads), seed=seed)
        return _split(out, [(p.rows, p.batched) for p in payloads])

    def reply(self, msg: dict[Any, Any], result: np.ndarray, timing: Timing, conn: Connection) -> Reply:
        return {"actions": np.asarray(result, dtype=np.float32), "server_timing": timing.as_dict()}

    def error(self, msg: dict[Any, Any], text: str) -> Reply:
        return text


# ------------------------------------------------------------------------------------ DiT4DiT


class Dit4DitPing(Handler):
    """DiT4DiT's ``{"type": "ping"}`` -> its ok envelope."""

    name = "dit4dit_ping"

    def claims(self, msg: dict[Any, Any]) -> bool:
        return protocol.is_dit4dit_ping(msg)

    def prepare(self, msg: dict[Any, Any], conn: Connection) -> Reply:
        protocol.check_dit4dit_keys(msg)
        return protocol.dit4dit_ping(msg)

    def error(self, msg: dict[Any, Any], text: str) -> Reply:
        return protocol.dit4dit_error(msg, text)


class Dit4DitInfer(Handler):
    """DiT4DiT's ``{"examples": [...]}`` (model space in) -> its envelope with the NORMALIZED
    chunk; any other ``type`` is refused in the same envelope (``protocol.py``)."""

    name = "dit4dit_infer"

    def __init__(self, policy: ServablePolicy, gate: InstructionGate) -> None:
        self._policy, self._gate = policy, gate
        io = policy.io
        h, w = io.image_size
        layout = f"views {', '.join(io.camera_keys)} each {h}x{w}, tiled by {io.view_layout!r}"
        self._space = protocol.ModelSpace(io.frame_size, io.spec.state_width, layout)

    def claims(self, msg: dict[Any, Any]) -> bool:
        return protocol.is_dit4dit(msg)

    def prepare(self, msg: dict[Any, Any], conn: Connection) -> Call:
        inputs, seed = protocol.parse_dit4dit(msg, self._space)
        self._gate.check(inputs.instructions)
        return Call(inputs, seed)

    def run(self, payloads: Sequence[protocol.ModelInputs], seed: int | None) -> list[np.ndarray]:
        merged = payloads[0] if len(payloads) == 1 else protocol.concat_model_inputs(payloads)
        out = self._policy.predict_normalized(merged.frames, merged.state, merged.instructions, seed=seed)
        return _split(out, [(p.rows, True) for p in payloads])

    def reply(self, msg: dict[Any, Any], result: np.ndarray, timing: Timing, conn: Connection) -> Reply:
        return protocol.dit4dit_result(msg, result)

    def error(self, msg: dict[Any, Any], text: str) -> Reply:
        return protocol.dit4dit_error(msg, text)


# ------------------------------------------------------------------------------------ registry


class Handlers:
    """The handlers of one server, in the order they are asked to claim a message."""

    def __init__(self, handlers: Sequence[Handler]) -> None:
        names = [h.name for h in handlers]
        if len(set(names)) != len(names):
            raise ValueError(f"handler names must be unique, got {names}")
        self._handlers = list(handlers)

    @classmethod
    def for_policy(cls, policy: ServablePolicy, gate: InstructionGate) -> Handlers:
        """Every kind this server answers. The control message and the DiT4DiT ones are told
        apart by their keys; anything else that is a dict is read as an observation."""
        return cls([
            OpenpiControl(),
            Dit4DitPing(),
            Dit4DitInfer(policy, gate),
            ObservationRequest(policy, gate),
        ])

    def __iter__(self) -> Iterator[Handler]:
        return iter(self._handlers)

    def find(self, msg: Any) -> Handler:
        """The handler of a decoded message; a message nobody claims is a RequestError."""
        if not isinstance(msg, dict):
            raise protocol.RequestError(f"expected an observation dict, got {type(msg).__name__}")
        for handler in self._handlers:
            if handler.claims(msg):
                return handler
        raise protocol.RequestError(
            f"no request kind has the keys {sorted(map(str, msg))[:8]}; this server answers {[str(h.name) for h in self]}"
        )


def _split(out: np.ndarray, parts: Sequence[tuple[int, bool]]) -> list[np.ndarray]:
    """Batched output rows -> one result per (rows, batched) request; a request sent without a
    batch axis gets its result without one."""
    results, start = [], 0
    for rows, batched in parts:
        results.append(out[start : start + rows] if batched else out[start])
        start += rows
    return results
