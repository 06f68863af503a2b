"""The two request formats one server answers on the same websocket, and their replies.

**openpi / dit4dit_npu** (what ``dit4dit_client`` and openpi's ``WebsocketClientPolicy``
send): an observation dict (``transforms/observation.py``: our flat camera keys, or openpi's
nested ``images`` + ``prompt``), an optional ``seed`` -> ``{"actions": float32 (chunk, action_dim)
in robot units, "server_timing": {...}}``. A refused request is answered the way openpi's server
reports errors, with a text frame holding the one-line message (openpi's client raises
``RuntimeError`` with it, ours ``ServerError``), but the connection stays open for the next
request. ``{"__ctrl__": ...}`` episode messages are acknowledged as openpi does (and clear the
connection's session). Every reply also carries ``chunk_id``, the count of chunks sent on the
connection.

**Real-time chunking** (our addition; ``session.py``): an observation may carry ``"rtc": {...}``
to have its chunk inpainted onto the previous one (``DiT4DiTPolicy.predict_action``'s
``prev_chunk`` / ``inference_delay`` / ``execution_horizon``):

================================  ===========================================================
``executed``: int                 actions of this connection's last chunk executed when the
                                  observation was taken (the server keeps that chunk)
``prev_chunk``: (L, A) float      or: the previous chunk's actions still to come, sent as is
``inference_delay``: int          control steps until this reply is executed (frozen prefix);
                                  left out: ceil(max recent server latency x ``control_hz``)
``control_hz``: float             the robot's control rate (remembered by the connection)
``execution_horizon``: int        the paper's s (default: H - L, all of the prefix)
``max_guidance_weight``: float    the paper's beta (default 5)
``chunk_id``: int                 the chunk ``executed`` counts from (refused if not the last)
================================  ===========================================================

The reply then echoes ``"rtc": {"inference_delay", "executed", "prefix_steps"}``.

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
from dit4dit_npu.policy.contract import ModelSpaceRequest
from dit4dit_npu.transforms.observation import IMAGES, INSTRUCTION, PROMPT, STATE, parse_seed

DIT4DIT_INFER = ("infer", "predict_action")
DIT4DIT_PING = "ping"
# Sent by DiT4DiT's clients with every request; its server passed them to predict_action, which
# ignored them (its sampler is fixed by the config). Listed so they are ignored knowingly.
DIT4DIT_IGNORED = ("do_sample", "use_ddim", "num_ddim_steps")
DIT4DIT_KEYS = ("type", "request_id", "examples", "seed", *DIT4DIT_IGNORED)
OPENPI_CTRL = "__ctrl__"
RTC = "rtc"  # the real-time-chunking field of an observation request (and of its reply)


class RequestError(DiT4DiTError, ValueError):
    """A request the server refuses before any inference; the message is the client's answer."""


# ----------------------------------------------------------------------------- request size


@dataclass(frozen=True)
class RequestLimits:
    """What one request may hold, checked from its arrays' shapes before anything is converted or
    resized. The message-size cap alone does not bound memory: 1024 tiny images fit in 92 KB and
    take ~1 GB once resized to the model's size."""

    max_rows: int  # observation rows (a batch axis) or DiT4DiT examples per request
    max_decoded_bytes: int  # the request's images once decoded and resized


def observation_rows_and_bytes(obs: dict[Any, Any], cameras: int, image_size: Sequence[int]) -> tuple[int, int]:
    """(rows, bytes once decoded and resized) of an observation as sent (ours or openpi's layout):
    rows from the batch axis of its images and state and its list of instructions; bytes are the
    images as sent plus ``rows`` frames of every camera at ``image_size``."""
    values = [v for k, v in obs.items() if k != IMAGES]
    nested = obs.get(IMAGES)
    if isinstance(nested, dict):
        values += list(nested.values())
    rows, sent = 1, 0
    for v in values:
        if isinstance(v, np.ndarray):
            if v.ndim == 4:  # a batch of images
                rows = max(rows, v.shape[0])
            if v.ndim >= 3:
                sent += v.nbytes
    state = obs.get(STATE)
    batched_array = isinstance(state, np.ndarray) and state.ndim == 2
    batched_list = isinstance(state, list | tuple) and bool(state) and isinstance(state[0], list | tuple | np.ndarray)
    if batched_array or batched_list:
        rows = max(rows, len(state))
    for key in (INSTRUCTION, PROMPT):
        if isinstance(obs.get(key), list | tuple):
            rows = max(rows, len(obs[key]))
    h, w = image_size
    return rows, sent + rows * cameras * int(h) * int(w) * 3


def check_observation_size(obs: dict[Any, Any], limits: RequestLimits, cameras: int, image_size: Sequence[int]) -> None:
    rows, size = observation_rows_and_bytes(obs, cameras, image_size)
    check_rows(rows, limits)
    if size > limits.max_decoded_bytes:
        h, w = image_size
        raise RequestError(
            f"request would take {size / 2**20:.1f} MiB once decoded and resized to {h}x{w} ({rows} row(s) x "
            f"{cameras} camera(s)), over this server's limit of {limits.max_decoded_bytes / 2**20:.1f} MiB "
            "(--max-decoded-mb); send fewer rows per request"
        )


def check_rows(rows: int, limits: RequestLimits) -> None:
    if rows > limits.max_rows:
        raise RequestError(
            f"request has {rows} rows; this server answers at most {limits.max_rows} per request (--max-rows): "
            f"split it into requests of at most {limits.max_rows}"
        )


def is_dit4dit(msg: dict[Any, Any]) -> bool:
    """DiT4DiT's protocol carries ``examples`` or a ``type``; an observation never does."""
    return "examples" in msg or "type" in msg


def openpi_ack(ctrl: Any) -> dict[str, str]:
    """openpi's server acknowledges episode bookkeeping; a stateless policy has nothing to do."""
    return {"__ack__": ctrl if ctrl in ("episode_start", "episode_end") else "ignored"}


# ----------------------------------------------------------------------------- DiT4DiT protocol


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


def parse_dit4dit(
    msg: dict[Any, Any], space: ModelSpace, limits: RequestLimits | None = None
) -> tuple[ModelSpaceRequest, int | None]:
    """An ``infer`` request -> (inputs, seed). Raises RequestError naming the key."""
    check_dit4dit_keys(msg)
    kind = msg.get("type", "infer")
    if not isinstance(kind, str) or kind not in DIT4DIT_INFER:
        raise RequestError(f"Unsupported message type {kind!r}; expected 'infer', 'predict_action' or 'ping'")
    seed = parse_seed(msg.get("seed"))
    examples = msg.get("examples")
    if not isinstance(examples, list | tuple) or not examples:
        raise RequestError("examples: expected a non-empty list of example dicts {image, state, lang}")
    if limits is not None:  # each example's frame is exactly the model's size: rows bound the bytes
        check_rows(len(examples), limits)
    rows = [_example(i, ex, space) for i, ex in enumerate(examples)]
    state = None if space.state_width == 0 else np.stack([r[1] for r in rows])
    return ModelSpaceRequest(np.stack([r[0] for r in rows]), state, [r[2] for r in rows]), seed


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
