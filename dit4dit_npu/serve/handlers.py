"""Request kinds: one handler per kind of message the server answers, tried in a fixed order.

A handler owns everything about its kind, so the server never branches on it:

- ``claims(msg)``: is this decoded message mine? (the first handler of ``Handlers`` that claims
  it gets it);
- ``prepare(msg, conn)``: check it alone, before any batching -> a ``Call`` for the model, or
  an immediate reply (a ping, an acknowledgement). Raises on bad input;
- ``run(payloads, seed)``: on the inference thread, one model call for the ``Call`` payloads of
  its kind that arrived together with the same seed and group -> one result per payload;
- ``reply(msg, result, timing, conn)`` / ``error(msg, text)``: the answer in its clients' format.

Every method that sees a request gets the ``Connection`` it arrived on. A connection's messages
are handled one after another (the next is read only once this one is answered), so a handler may
keep per-connection state there without locks, even though ``prepare`` may run on a helper thread:
its ``session`` (``session.py``: the last chunk sent, for real-time chunking), dropped with it.

A reply is a dict (packed with msgpack) or a str (sent as a text frame: how openpi's server
reports errors, and its client raises with the text).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import numpy as np

from dit4dit_npu.policy import OutOfRangeError, PolicyInputError
from dit4dit_npu.policy.contract import ModelSpaceRequest, ParsedRequest, PolicyDescription
from dit4dit_npu.policy.rtc import RTCRequest, parse_rtc
from dit4dit_npu.serve import protocol
from dit4dit_npu.serve.batching import Timing
from dit4dit_npu.serve.session import Session

Reply = dict[str, Any] | str


class ServablePolicy(Protocol):
    """What the server needs from a policy (DiT4DiTPolicy satisfies it; ``policy/contract.py``):
    it never reads its PolicyIO and never sets anything on it (its limits, e.g. the cap on new
    instructions, are given when it is loaded). ``predict_batch`` raises ``NonFiniteActionError``
    rather than return NaN/inf, and ``parse`` / ``with_rtc`` run every input check (once): that
    is the policy's."""

    @property
    def max_added_instructions(self) -> int | None: ...

    def describe(self) -> PolicyDescription: ...

    def parse(self, obs: Any, allow_out_of_range: bool = False) -> ParsedRequest: ...

    def with_rtc(self, parsed: ParsedRequest, rtc: RTCRequest) -> ParsedRequest: ...

    def predict_batch(
        self, requests: Sequence[ParsedRequest] | Sequence[ModelSpaceRequest], seed: int | None = None
    ) -> list[np.ndarray]: ...


# How a server's refusal of an out-of-range input names its opt-out (serve/cli.py's flag).
SERVER_OPT_OUT = "a server started with --allow-out-of-range answers it, with this warning in the reply"


@dataclass(eq=False)  # one per socket: compared and hashed by identity
class Connection:
    """One client connection, handed to every handler call for its requests: the peer's address
    and its session (the real-time-chunking state), dropped when the connection closes."""

    remote: Any = None
    session: Session | None = field(default_factory=Session)

    def close(self) -> None:
        """Free the session's state (a request still in the model finds no session to update)."""
        if self.session is not None:
            self.session.reset()
        self.session = None


@dataclass(frozen=True)
class Call:
    """A checked request waiting for the model. Calls of the same handler, seed and group that
    arrive together share one model call (``batching.py``): a seeded call draws one noise for all
    its rows, so only equal seeds can share one and still get their single-call answers; the
    group keeps apart calls that cannot be one model call (RTC vs plain, guidance strength)."""

    payload: Any  # what the handler's ``run`` takes: a ParsedRequest, a ModelSpaceRequest
    seed: int | None
    warnings: tuple[str, ...] = ()  # sent back with the reply ("warnings"), e.g. an allowed out-of-range state
    group: Hashable = None

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
    """openpi's episode bookkeeping ``{"__ctrl__": ...}``, acknowledged as openpi's server does; an
    episode's start or end also clears the connection's session (its chunk is the old episode's)."""

    name = "openpi_control"

    def claims(self, msg: dict[Any, Any]) -> bool:
        return protocol.OPENPI_CTRL in msg

    def prepare(self, msg: dict[Any, Any], conn: Connection) -> Reply:
        ack = protocol.openpi_ack(msg[protocol.OPENPI_CTRL])
        if ack["__ack__"] != "ignored" and conn.session is not None:
            conn.session.reset()
        return ack

    def error(self, msg: dict[Any, Any], text: str) -> Reply:
        return text


class ObservationRequest(Handler):
    """A robot observation (ours or openpi's layout, single or batched, optional ``seed``, optional
    ``rtc``) -> ``{"actions": float32 robot units, "server_timing", "chunk_id"[, "rtc"]}``; errors as
    one-line text frames. Every chunk sent is remembered in the connection's session, so a later
    request can ask for real-time chunking onto it (``session.py``).

    Before it is parsed, its rows and decoded size are checked against ``limits`` (from shapes
    alone: nothing is converted or resized for a request that is refused). A state far outside the
    training range is refused, or with ``allow_out_of_range`` answered with the warning in the
    reply's ``"warnings"``.

    Claims every dict no earlier handler claimed, so it must come last: a robot that sent a
    malformed observation is told which observation keys were expected."""

    name = "observation"

    def __init__(
        self, policy: ServablePolicy, gate: InstructionGate, limits: protocol.RequestLimits | None,
        allow_out_of_range: bool,
    ) -> None:
        self._policy, self._gate, self._limits, self._allow = policy, gate, limits, allow_out_of_range
        self._desc = policy.describe()

    def claims(self, msg: dict[Any, Any]) -> bool:
        return True

    def prepare(self, msg: dict[Any, Any], conn: Connection) -> Call:
        if conn.session is not None:
            conn.session.forget_pending()
        obs = dict(msg)
        seed = protocol.parse_seed(obs.pop("seed", None))
        rtc = obs.pop(protocol.RTC, None)
        if self._limits is not None:
            protocol.check_observation_size(obs, self._limits, len(self._desc.camera_keys), self._desc.image_size)
        try:
            parsed = self._policy.parse(obs, allow_out_of_range=self._allow)  # the one parse (and resize)
        except OutOfRangeError as e:
            raise protocol.RequestError(f"{e.problem}; refused ({SERVER_OPT_OUT})") from None
        self._gate.check(parsed.observation.instructions)
        if rtc is None:
            return Call(parsed, seed, parsed.warnings)
        request = conn.session.resolve(parse_rtc(rtc), parsed.observation)  # parse_rtc names rtc.<field>
        try:
            parsed = self._policy.with_rtc(parsed, request)
        except OutOfRangeError as e:
            raise protocol.RequestError(f"rtc.{e.problem}; refused ({SERVER_OPT_OUT})") from None
        except PolicyInputError as e:
            raise protocol.RequestError(f"rtc.{e}") from None
        return Call(parsed, seed, parsed.warnings, group=("rtc", parsed.prefix.max_guidance_weight))

    def run(self, payloads: Sequence[ParsedRequest], seed: int | None) -> list[np.ndarray]:
        return self._policy.predict_batch(payloads, seed=seed)

    def reply(self, msg: dict[Any, Any], result: np.ndarray, timing: Timing, conn: Connection) -> Reply:
        actions = np.asarray(result, dtype=np.float32)
        out: dict[str, Any] = {"actions": actions, "server_timing": timing.as_dict()}
        session = conn.session
        if session is not None:  # None only once the connection closed
            if session.pending is not None:
                out[protocol.RTC] = session.pending
            out["chunk_id"] = session.remember(actions, (timing.queue_ms + timing.infer_ms) / 1e3)
        return out

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

    def __init__(self, policy: ServablePolicy, gate: InstructionGate, limits: protocol.RequestLimits | None) -> None:
        self._policy, self._gate, self._limits = policy, gate, limits
        d = policy.describe()
        h, w = d.image_size
        layout = f"views {', '.join(d.camera_keys)} each {h}x{w}, tiled by {d.view_layout!r}"
        self._space = protocol.ModelSpace(d.frame_size, d.state_width, layout)

    def claims(self, msg: dict[Any, Any]) -> bool:
        return protocol.is_dit4dit(msg)

    def prepare(self, msg: dict[Any, Any], conn: Connection) -> Call:
        inputs, seed = protocol.parse_dit4dit(msg, self._space, self._limits)
        self._gate.check(inputs.instructions)
        return Call(inputs, seed)

    def run(self, payloads: Sequence[ModelSpaceRequest], seed: int | None) -> list[np.ndarray]:
        return self._policy.predict_batch(payloads, seed=seed)  # one normalized (rows, chunk, width) each

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
    def for_policy(
        cls, policy: ServablePolicy, gate: InstructionGate, limits: protocol.RequestLimits | None = None,
        allow_out_of_range: bool = False,
    ) -> Handlers:
        """Every kind this server answers. The control message and the DiT4DiT ones are told
        apart by their keys; anything else that is a dict is read as an observation. ``limits``
        None: requests of any size (the server always passes its limits)."""
        return cls([
            OpenpiControl(),
            Dit4DitPing(),
            Dit4DitInfer(policy, gate, limits),
            ObservationRequest(policy, gate, limits, allow_out_of_range),
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
