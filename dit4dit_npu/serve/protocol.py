"""The two request formats one server answers on the same websocket, and their replies.

**openpi / dit4dit_npu** (what ``dit4dit_npu.serve.client`` and openpi's ``WebsocketClientPolicy``
send): an observation dict (``transforms/observation.py``: our flat camera keys, or openpi's
nested ``images`` + ``prompt``), an optional ``seed`` -> ``{"actions": float32 (chunk, action_dim)
in robot units, "server_timing": {...}}``. A refused request is answered the way openpi's server
reports errors, with a text frame holding the one-line message (openpi's client raises
``RuntimeError`` with it, ours ``ServerError``), but the connection stays open for the next
request. ``{"__ctrl__": ...}`` episode messages are acknowledged as openpi does.

**DiT4DiT's own** (its LIBERO / RoboCasa clients, ``websocket_policy_client.py``): a message with
``examples`` or ``type``. ``type`` ``"ping"`` -> ``{"status": "ok", "ok": True, "type": "ping",
"request_id": ...}``; ``"infer"`` (the default) or ``"predict_action"`` with ``examples``, one dict
per row: ``image`` = a list of frames (frame 0 is the observation; the original treated later
frames as video targets, which never change actions) or one frame, uint8 (H, W_tiled, 3) with
the camera views already resized and tiled as the policy's ``frame_size``; ``state`` = (1, S) or
(S,) already encoded and padded to the model's state width, as the original clients do
themselves; ``lang`` = the instruction. Other example keys (the LIBERO client leaves
``wrist_image`` in) and the clients' ``do_sample`` / ``use_ddim`` / ``num_ddim_steps`` are ignored,
as the original ignored them. The reply is the original's envelope ``{"status": "ok", "ok": True,
"type": "inference_result", "request_id": ..., "data": {"normalized_actions": float32 (B, chunk,
action_width)}}``: NORMALIZED actions, padded dims included, exactly what the model outputs,
because these clients un-normalize with their own copy of the statistics. Errors come in the
original's envelope ``{"status": "error", "ok": False, ..., "error": {"message": ...}}``. An
optional top-level ``seed`` (our addition) makes the reply reproducible.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dit4dit_npu.errors import DiT4DiTError

SEED_LIMIT = 2**63  # seeds are ints in [0, 2**63): any torch / numpy generator takes them
DIT4DIT_INFER = ("infer", "predict_action")
DIT4DIT_PING = "ping"
# Sent by DiT4DiT's clients with every request; its server passed them to predict_action, which
# ignored them (its sampler is fixed by the config). Listed so they are ignored knowingly.
DIT4DIT_IGNORED = ("do_sample", "use_ddim", "num_ddim_steps")
DIT4DIT_KEYS = ("type", "request_id", "examples", "seed", *DIT4DIT_IGNORED)
OPENPI_CTRL = "__ctrl__"


class RequestError(DiT4DiTError, ValueError):
    """A request the server refuses before any inference; the message is the client's answer."""


def parse_seed(value: Any) -> int | None:
    """None, or an int in [0, 2**63); a float, bool or out-of-range value is refused."""
    if value is None:
        return None
    if isinstance(value, bool | np.bool_) or not isinstance(value, int | np.integer):
        raise RequestError(f"seed: expected an int in [0, 2**63), got {type(value).__name__} {value!r}")
    if not 0 <= int(value) < SEED_LIMIT:
        raise RequestError(f"seed: {int(value)} is out of range, expected an int in [0, 2**63)")
    return int(value)


def is_dit4dit(msg: dict[Any, Any]) -> bool:
    """DiT4DiT's protocol carries ``examples`` or a ``type``; an observation never does."""
    return "examples" in msg or "type" in msg


def openpi_ack(ctrl: Any) -> dict[str, str]:
    """openpi's server acknowledges episode bookkeeping; a stateless policy has nothing to do."""
    return {"__ack__": ctrl if ctrl in ("episode_start", "episode_end") else "ignored"}


# ----------------------------------------------------------------------------- DiT4DiT protocol


@dataclass
class ModelInputs:
    """DiT4DiT examples, already in model space (what ``DiT4DiTPolicy.predict_normalized`` takes)."""

    frames: np.ndarray  # uint8 (B, H, W_tiled, 3)
    state: np.ndarray | None  # float32 (B, state_width), None when the policy takes no state
    instructions: list[str]

    @property
    def rows(self) -> int:
        return len(self.instructions)


def concat_model_inputs(parts: Sequence[ModelInputs]) -> ModelInputs:
    return ModelInputs(
        frames=np.concatenate([p.frames for p in parts]),
        state=None if parts[0].state is None else np.concatenate([p.state for p in parts]),
        instructions=[s for p in parts for s in p.instructions],
    )


@dataclass(frozen=True)
class ModelSpace:
    """What a DiT4DiT example must hold for this policy (from its PolicyIO)."""

    frame_size: tuple[int, int]
    state_width: int
    layout: str  # how the views are tiled, for error messages and metadata


def request_id(msg: dict[Any, Any]) -> Any:
    """The id a DiT4DiT client matches replies by (its clients leave it out: "default")."""
    return msg.get("request_id", "default")


def check_dit4dit_keys(msg: dict[Any, Any]) -> None:
    unknown = sorted(str(k) for k in msg if k not in DIT4DIT_KEYS)
    if unknown:
        raise RequestError(f"unknown request key(s) {unknown}; a DiT4DiT request has {list(DIT4DIT_KEYS)}")


def parse_dit4dit(msg: dict[Any, Any], space: ModelSpace) -> tuple[ModelInputs, int | None]:
    """An ``infer`` request -> (inputs, seed). Raises RequestError naming the key."""
    check_dit4dit_keys(msg)
    kind = msg.get("type", "infer")
    if not isinstance(kind, str) or kind not in DIT4DIT_INFER:
        raise RequestError(f"Unsupported message type {kind!r}; expected 'infer', 'predict_action' or 'ping'")
    seed = parse_seed(msg.get("seed"))
    examples = msg.get("examples")
    if not isinstance(examples, list | tuple) or not examples:
        raise RequestError("examples: expected a non-empty list of example dicts {image, state, lang}")
    rows = [_example(i, ex, space) for i, ex in enumerate(examples)]
    state = None if space.state_width == 0 else np.stack([r[1] for r in rows])
    return ModelInputs(np.stack([r[0] for r in rows]), state, [r[2] for r in rows]), seed


def _example(i: int, ex: Any, space: ModelSpace) -> tuple[np.ndarray, np.ndarray | None, str]:
    name = f"examples[{i}]"
    if not isinstance(ex, dict):
        raise RequestError(f"{name}: expected a dict with image, state, lang, got {type(ex).__name__}")
    for key in ("image", "lang", *(("state",) if space.state_width else ())):
        if key not in ex:
            raise RequestError(f"{name}: missing {key!r} (an example has image, state, lang)")
    image = ex["image"]
    if isinstance(image, list | tuple):
        if not image:
            raise RequestError(f"{name}.image: empty list of frames")
        image = image[0]  # frame 0 is the observation; later frames never changed actions
    frame = np.asarray(image)
    h, w = space.frame_size
    if frame.dtype != np.uint8 or frame.shape != (h, w, 3):
        raise RequestError(
            f"{name}.image: expected a uint8 ({h}, {w}, 3) frame ({space.layout}), "
            f"got {frame.dtype} {frame.shape}"
        )
    return frame, _model_state(name, ex.get("state"), space.state_width), _lang(name, ex["lang"])


def _model_state(name: str, value: Any, width: int) -> np.ndarray | None:
    if width == 0:
        if value is not None:
            raise RequestError(f"{name}.state: this policy takes no state; leave it out")
        return None
    try:
        state = np.asarray(value, dtype=np.float32)
    except (TypeError, ValueError):
        raise RequestError(f"{name}.state: expected numbers, got {type(value).__name__}") from None
    if state.shape not in ((width,), (1, width)):
        raise RequestError(
            f"{name}.state: expected shape (1, {width}) or ({width},): the state encoded and padded to "
            f"the model's state width, as DiT4DiT clients send it; got {state.shape}"
        )
    if not np.isfinite(state).all():
        raise RequestError(f"{name}.state: contains NaN or inf")
    return state.reshape(width)


def _lang(name: str, value: Any) -> str:
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="replace")
    if not isinstance(value, str) or not value.strip():
        raise RequestError(f"{name}.lang: expected a non-empty instruction string, got {value!r:.60}")
    return value


def is_dit4dit_ping(msg: dict[Any, Any]) -> bool:
    kind = msg.get("type")
    return isinstance(kind, str) and kind == DIT4DIT_PING


def dit4dit_ping(msg: dict[Any, Any]) -> dict[str, Any]:
    return {"status": "ok", "ok": True, "type": "ping", "request_id": request_id(msg)}


def dit4dit_result(msg: dict[Any, Any], normalized: np.ndarray) -> dict[str, Any]:
    return {
        "status": "ok",
        "ok": True,
        "type": "inference_result",
        "request_id": request_id(msg),
        "data": {"normalized_actions": np.asarray(normalized, dtype=np.float32)},
    }


def dit4dit_error(msg: dict[Any, Any], message: str) -> dict[str, Any]:
    """The original's error envelope; its ``type`` is "unknown" for a message type it did not know."""
    kind = msg.get("type", "infer")
    known = isinstance(kind, str) and kind in (*DIT4DIT_INFER, DIT4DIT_PING)
    return {
        "status": "error",
        "ok": False,
        "type": "inference_result" if known else "unknown",
        "request_id": request_id(msg),
        "error": {"message": message},
    }
