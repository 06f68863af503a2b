"""A robot's observation dict -> checked numpy arrays (single or batched), one clear error each.

    {camera_key: uint8 (H, W, 3) or (B, H, W, 3), "state": (state_dim,) or (B, state_dim),
     "instruction": str or list[str]}

openpi's layout is accepted as well: the instruction called "prompt" (giving both is an error:
which one would win?) and the cameras nested under "images" by short name, channels-first or
last, as openpi's ALOHA clients send them:

    {"images": {"cam_high": uint8 (3, H, W) or (H, W, 3), ...}, "state": ..., "prompt": str}

A short name maps to the camera key ``observation.images.<name>`` (LeRobot's naming, which the
training config's camera keys use). Every image goes through the PolicyIO's crop and resize
steps (the training frames' path); one of another size than the model's is accepted only when its
aspect ratio matches the training videos': a distorted view is something the model never saw. A camera with a crop (``PolicyIO.camera_crops``) is cut to its
region of interest first: every image sent is a whole camera frame, at any resolution.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dit4dit_npu.errors import DiT4DiTError

STATE, INSTRUCTION = "state", "instruction"
PROMPT = "prompt"  # openpi's name for the instruction
IMAGES = "images"  # openpi's nested {short camera name: image}
CAMERA_PREFIX = "observation.images."
# Live camera aspect ratio may differ this much from the training videos' before it is an error.
ASPECT_TOLERANCE = 0.02
SEED_LIMIT = 2**63  # seeds are ints in [0, 2**63): any torch / numpy generator takes them


class PolicyInputError(DiT4DiTError, ValueError):
    """An observation the policy cannot take; the message says what was expected and what came."""


def parse_seed(value: Any) -> int | None:
    """A sampling seed as a caller or a request gives it: None, or an int in [0, 2**63); a float,
    bool or out-of-range value is refused (torch would fail on it with a message of its own)."""
    if value is None:
        return None
    if isinstance(value, bool | np.bool_) or not isinstance(value, int | np.integer):
        raise PolicyInputError(f"seed: expected an int in [0, 2**63), got {type(value).__name__} {value!r}")
    if not 0 <= int(value) < SEED_LIMIT:
        raise PolicyInputError(f"seed: {int(value)} is out of range, expected an int in [0, 2**63)")
    return int(value)


@dataclass
class Observation:
    """A parsed observation: what ``PolicyIO.parse_observation`` returns (and ``DiT4DiTPolicy.parse``
    wraps in a ParsedRequest); single observations carry a batch axis of 1."""

    views: np.ndarray  # uint8 (B, V, H, W, 3) at the model's image size, cameras in model order
    state: np.ndarray  # float64 (B, state_dim), robot units
    instructions: list[str]
    batched: bool  # False: sent without a batch axis, so its actions are returned without one

    @property
    def rows(self) -> int:
        return len(self.instructions)


def concat_observations(parts: Sequence[Observation]) -> Observation:
    """Parsed observations (single or batched) -> one batched observation, rows in order."""
    return Observation(
        views=np.concatenate([p.views for p in parts]),
        state=np.concatenate([p.state for p in parts]),
        instructions=[s for p in parts for s in p.instructions],
        batched=True,
    )


def parse_observation(
    obs: Any,
    cameras: Sequence[str],
    state_dim: int,
    view: Callable[[str, np.ndarray], np.ndarray],
    image_size: tuple[int, int],
    source_sizes: dict[str, list[list[int]]] | None = None,
    crops: Collection[str] = (),
) -> Observation:
    """``view(key, image)``: the PolicyIO's path from a camera image to the model's view (its crop
    and resize steps, as for training frames), applied to every image; ``image_size`` and
    ``source_sizes`` (the training videos' sizes) decide which sizes are accepted; ``crops``: the
    cameras the policy crops itself (sent whole, at the training videos' aspect ratio)."""
    if not isinstance(obs, dict):
        raise PolicyInputError(f"observation must be a dict, got {type(obs).__name__}")
    obs, names = _canonical_keys(obs, cameras)
    _check_keys(obs, cameras)
    views: list[np.ndarray] = []
    batched: bool | None = None
    for key in cameras:
        name = names.get(key, key)  # errors name the key the client sent
        imgs, is_batch = _images(name, obs[key], image_size, (source_sizes or {}).get(key), key in crops)
        if batched is None:
            batched = is_batch
        elif is_batch != batched or len(imgs) != len(views[0]):
            raise PolicyInputError(
                f"{name}: {len(imgs)} image(s) {'batched' if is_batch else 'single'}, but "
                f"{names.get(cameras[0], cameras[0])} has "
                f"{len(views[0])} ({'batched' if batched else 'single'}); every camera needs the same batch size"
            )
        views.append(np.stack([view(key, x) for x in imgs]))
    b, batched = len(views[0]), bool(batched)
    return Observation(
        views=np.stack(views, axis=1),
        state=_state(obs[STATE], b, batched, state_dim),
        instructions=_instructions(obs[INSTRUCTION], b, batched),
        batched=batched,
    )


def _canonical_keys(obs: dict[str, Any], cameras: Sequence[str]) -> tuple[dict[str, Any], dict[str, str]]:
    """openpi's names and nesting -> ours (the input dict is not modified), and camera key ->
    the name the client used for it (``images.<name>``) where that differs."""
    obs, names = dict(obs), {}
    if PROMPT in obs:
        if INSTRUCTION in obs:
            raise PolicyInputError(
                "observation has both 'prompt' and 'instruction': send one ('prompt' is openpi's name for it)"
            )
        obs[INSTRUCTION] = obs.pop(PROMPT)
    if IMAGES in obs:
        nested = obs.pop(IMAGES)
        if not isinstance(nested, dict):
            raise PolicyInputError(
                f"images: expected a dict {{camera name: image}} (openpi layout), got {type(nested).__name__}"
            )
        for name, img in nested.items():
            key = name if name in cameras else f"{CAMERA_PREFIX}{name}"
            if key in obs:
                raise PolicyInputError(f"images.{name}: camera {key!r} is also given as a top-level key; send it once")
            obs[key], names[key] = _channels_last(img), f"{IMAGES}.{name}"
    return obs, names


def _channels_last(value: Any) -> Any:
    """openpi sends (3, H, W) / (B, 3, H, W); HWC passes unchanged (the last axis decides)."""
    img = np.asarray(value)
    if img.ndim in (3, 4) and img.shape[-1] != 3 and img.shape[-3] == 3:
        return np.moveaxis(img, -3, -1)
    return img


def _check_keys(obs: dict[str, Any], cameras: Sequence[str]) -> None:
    expected = [*cameras, STATE, INSTRUCTION]
    missing = [k for k in expected if k not in obs]
    unknown = [k for k in obs if k not in expected]
    if missing or unknown:
        parts = ([f"missing {missing}"] if missing else []) + ([f"unexpected {unknown}"] if unknown else [])
        raise PolicyInputError(
            f"observation keys: {'; '.join(parts)}. Expected exactly {expected} "
            f"(camera keys from the training config; openpi's layout works too: 'images': {{name: image}} "
            f"for {CAMERA_PREFIX}<name>, 'prompt' for 'instruction'), got {sorted(map(str, obs))}"
        )


def _images(
    key: str, value: Any, size: tuple[int, int], source_sizes: list[list[int]] | None, cropped: bool
) -> tuple[np.ndarray, bool]:
    """The checked uint8 (B, h, w, 3) images of one camera (not yet cropped or resized)."""
    img = np.asarray(value)
    if img.dtype != np.uint8:
        hint = " (scale [0, 1] floats with (x * 255).round().astype(np.uint8))" if img.dtype.kind == "f" else ""
        raise PolicyInputError(f"{key}: expected a uint8 RGB image, got dtype {img.dtype}{hint}")
    if img.ndim not in (3, 4) or img.shape[-1] != 3:
        chw = img.ndim in (3, 4) and img.shape[-3] == 3
        hint = " (channels-first? use HWC: img.transpose(1, 2, 0))" if chw else ""
        raise PolicyInputError(f"{key}: expected (H, W, 3) or (B, H, W, 3) uint8, got shape {img.shape}{hint}")
    batched = img.ndim == 4
    imgs = img if batched else img[None]
    if len(imgs) == 0 or min(imgs.shape[1:3]) < 2:
        raise PolicyInputError(f"{key}: empty image or batch, shape {img.shape}")
    h, w = imgs.shape[1:3]
    if cropped or (h, w) != tuple(size):  # a cropped camera: a whole frame at the videos' aspect
        _check_aspect(key, h, w, size, source_sizes, cropped=cropped)
    return imgs, batched


def _check_aspect(
    key: str, h: int, w: int, size: tuple[int, int], sources: list[list[int]] | None, cropped: bool = False
) -> None:
    if not sources or any(abs((w / h) / (sw / sh) - 1.0) <= ASPECT_TOLERANCE for sh, sw in sources):
        return
    fix = (
        "send the whole camera frame (the policy crops this camera itself)"
        if cropped
        else f"crop to that aspect ratio, or pass images already at the model size {size[0]}x{size[1]}"
    )
    raise PolicyInputError(
        f"{key}: image size {h}x{w} (HxW) has another aspect ratio than the training videos "
        f"({' or '.join(f'{sh}x{sw}' for sh, sw in sources)}); {fix}"
    )


def _state(value: Any, b: int, batched: bool, state_dim: int) -> np.ndarray:
    try:
        raw = np.asarray(value)
        state = raw.astype(np.float64)
    except (TypeError, ValueError) as e:
        raise PolicyInputError(f"state: expected numbers, got {type(value).__name__} ({e})") from None
    if raw.dtype.kind not in "biuf":  # numpy would parse strings ("0.1") and datetimes as numbers
        raise PolicyInputError(f"state: expected numbers, got an array of dtype {raw.dtype}")
    want = (b, state_dim) if batched else (state_dim,)
    if state.shape != want:
        raise PolicyInputError(
            f"state: expected shape {want} (state_dim={state_dim}, robot units, unpadded), got {state.shape}"
        )
    if not np.isfinite(state).all():
        raise PolicyInputError("state: contains NaN or inf")
    return state if batched else state[None]


def _instructions(value: Any, b: int, batched: bool) -> list[str]:
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="replace")
    if isinstance(value, str):
        texts = [value] * b
    elif batched and isinstance(value, list | tuple) and all(isinstance(s, str) for s in value):
        texts = list(value)
        if len(texts) != b:
            raise PolicyInputError(f"instruction: {len(texts)} strings for a batch of {b}")
    else:
        raise PolicyInputError(
            f"instruction: expected a str{' or a list of str' if batched else ''}, got {type(value).__name__}"
        )
    if any(not s.strip() for s in texts):
        raise PolicyInputError("instruction: empty string")
    return texts
