"""Which data conventions an imported DiT4DiT run gets, as ``datasets.vla_data`` values.

DiT4DiT's conventions lived in code (its data config per robot type, its clients); here they are
keys of the run config (``config/datasets.py`` ``VLADataConfig``; ``transforms/encodings.py`` makes
them steps). An import takes, for each key, in order: the user's value (a flag of ``convert
dit4dit`` or an ``datasets.vla_data.KEY=...`` override: one name per concept), else the robot
type's (its data config and client), else DiT4DiT's general client behaviour; every value not
given is printed as a notice, with where it came from.

The robot type is the one given (``--robot-type``; ``custom`` = no robot type, the conventions
all come from flags), else a named mixture's, else the one whose specific statistics tag and
widths the statistics have. A generic tag (``new_embodiment``: any robot) names no robot, so with
it the robot type must be given.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dit4dit_npu.config.datasets import PART_ENCODINGS
from dit4dit_npu.config.original_data import GENERIC_TAGS, NAMED_MIXTURES, ROBOT_TYPES, RobotType
from dit4dit_npu.convert.checkpoint import ConversionError

CUSTOM = "custom"
# The datasets.vla_data keys an import decides (flags of `convert dit4dit` map onto these names).
KEYS = ("camera_keys", "view_layout", "image_size", "state_parts", "action_parts", "state_order",
        "action_order", "gripper_dims", "gripper_threshold", "action_clip")
# With no robot type, nothing says these: the user must.
REQUIRED_FOR_CUSTOM = {"camera_keys": "--camera-keys", "state_parts": "--state-parts"}
ORIGINAL_IMAGE_SIZE = [224, 224]  # its dataset resized every view to 224 x 224 (data_config.py)


def width(block: Any) -> int:
    """The dims a statistics block has (0 when it is malformed: reading it later says how)."""
    values = block.get("min") if isinstance(block, dict) else None
    return len(values) if isinstance(values, list) else 0


def choose_robot(
    name: str | None, data_mix: Any, tag: str, entry: dict[str, Any], stats_path: Path, notices: list[str]
) -> RobotType | None:
    """The robot type (None = ``custom``); the inferred choice is a notice."""
    choices = f"{', '.join(ROBOT_TYPES)}, or {CUSTOM} with its conventions as flags"
    if name == CUSTOM:
        return None
    if name is not None:
        if name not in ROBOT_TYPES:
            raise ConversionError(f"--robot-type {name!r}: expected one of {choices}")
        return ROBOT_TYPES[name]
    if isinstance(data_mix, str) and data_mix in NAMED_MIXTURES:
        robot = ROBOT_TYPES[NAMED_MIXTURES[data_mix][0]]
        notices.append(f"robot type: {robot.name} (the robot type of the config's data_mix {data_mix!r})")
        return robot
    dims = (width(entry.get("state")), width(entry.get("action")))
    if tag in GENERIC_TAGS:
        fits = [r.name for r in ROBOT_TYPES.values() if r.tag == tag and (r.state_dim, r.action_dim) == dims]
        raise ConversionError(
            f"{stats_path}: statistics tag {tag!r} is generic and more than one robot type fits its (state, action) "
            f"widths {dims} ({', '.join([*fits, CUSTOM])}): pass --robot-type"
        )
    fits = [r for r in ROBOT_TYPES.values() if r.tag == tag and (r.state_dim, r.action_dim) == dims]
    if len(fits) != 1:
        raise ConversionError(
            f"{stats_path}: cannot tell the robot type from tag {tag!r} with (state, action) widths {dims}; "
            f"pass --robot-type ({choices})"
        )
    notices.append(f"robot type: {fits[0].name} (from the statistics tag {tag!r} and widths {dims})")
    return fits[0]


def action_mask(entry: dict[str, Any], dim: int, where: str) -> list[bool]:
    """Its statistics' action mask (model order): True = min-max normalized, False = raw."""
    mask = entry.get("action", {}).get("mask") if isinstance(entry.get("action"), dict) else None
    if not isinstance(mask, list) or len(mask) != dim or not all(isinstance(m, bool) for m in mask):
        raise ConversionError(f"{where}: action statistics need a 'mask' of {dim} booleans")
    return mask


def parts(pairs: Sequence[tuple[int, str]]) -> list[dict[str, Any]]:
    return [{"size": int(s), "norm": n} for s, n in pairs]


def action_parts(mask_model: list[bool], order: Sequence[int] | None, binary: Sequence[int]) -> list[dict[str, Any]]:
    """Runs of the robot-order mask: min_max where it is True, none where False (its grippers
    passed raw), binary on the robot type's on/off dims."""
    native = [mask_model[list(order).index(i)] for i in range(len(mask_model))] if order else list(mask_model)
    modes = ["binary" if i in binary else ("min_max" if m else "none") for i, m in enumerate(native)]
    runs: list[tuple[int, str]] = []
    for m in modes:
        runs = runs[:-1] + [(runs[-1][0] + 1, m)] if runs and runs[-1][1] == m else [*runs, (1, m)]
    return parts(runs)


def text(key: str, value: Any) -> str:
    """A value as the flag takes it (parts as SIZE:NORM, ...)."""
    if key.endswith("_parts"):
        return ",".join(f"{p['size']}:{p['norm']}" for p in value)
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value)


def decide(
    robot: RobotType | None,
    given: dict[str, Any],
    mask_model: list[bool],
    original_image_size: Any,
    notices: list[str],
) -> dict[str, Any]:
    """datasets.vla_data values for every key of ``KEYS``: ``given`` wins; the rest is the robot
    type's (or DiT4DiT's general client behaviour), one notice each."""
    if robot is None:
        missing = [flag for key, flag in REQUIRED_FOR_CUSTOM.items() if key not in given]
        if missing:
            raise ConversionError(f"--robot-type {CUSTOM}: nothing says the {' and the '.join(missing)} of this robot; "
                                  f"pass {' and '.join(missing)}")
    who = f"robot type {robot.name}" if robot else "DiT4DiT's clients"
    order = given.get("action_order", robot.model_order if robot else None)
    said = "" if original_image_size in (None, ORIGINAL_IMAGE_SIZE) else (
        f"; the config's image_size {original_image_size} was never read")
    defaults: dict[str, tuple[Any, str]] = {
        "camera_keys": (list(robot.cameras) if robot else None, f"{who}'s cameras, primary first"),
        "view_layout": ("width", "DiT4DiT put the views side by side"),
        "image_size": (ORIGINAL_IMAGE_SIZE, f"DiT4DiT's dataset resized every view to 224 x 224{said}"),
        "state_parts": (parts(robot.state_parts) if robot else None, f"{who}'s state keys and encodings"),
        "action_parts": (action_parts(mask_model, order, robot.binary_dims if robot else ()),
                         "min_max where the statistics mask is true, raw where false"
                         + (f", binary on {who}'s grippers" if robot and robot.binary_dims else "")),
        "state_order": (list(robot.model_order) if robot and robot.model_order else None,
                        f"{who}'s model order" if robot and robot.model_order else "the robot's order"),
        "action_order": (list(order) if order else None, f"{who}'s model order" if order else "the robot's order"),
        "gripper_dims": (list(robot.gripper_dims) if robot else [],
                         f"{who}'s client binarized them" if robot and robot.gripper_dims else "none binarized"),
        "gripper_threshold": (0.5, "DiT4DiT's threshold"),
        "action_clip": ("all", "DiT4DiT's clients clip every dim to [-1, 1] before un-normalizing"),
    }
    out = {}
    for key in KEYS:
        if key in given:
            out[key] = given[key]
            continue
        value, why = defaults[key]
        out[key] = value
        notices.append(f"datasets.vla_data.{key}: {text(key, value) if value is not None else 'null'} ({why})")
    return out


# The encodings each parts flag takes (the schema's one list; actions have no sin/cos).
PART_FLAG_ENCODINGS = {"--state-parts": PART_ENCODINGS, "--action-parts": tuple(e for e in PART_ENCODINGS if e != "sincos")}


def blame(e: Exception, conventions: dict[str, Any] | None, config: Path) -> str:
    """An error of the imported config in one line: one about a convention given as a flag names
    the flag and its value (the value came from there, not from the run's ``config``)."""
    message = str(e)
    for key, value in (conventions or {}).items():
        if message.startswith(f"datasets.vla_data.{key}"):
            return f"--{key.replace('_', '-')} {text(key, value)}: {message}"
    return f"{config}: {message}"


def parse_parts(value: str, flag: str) -> list[dict[str, Any]]:
    """``SIZE:NORM[,SIZE:NORM...]`` (e.g. ``6:min_max,1:binary``) -> parts; an encoding the flag
    does not take is named with the ones it does."""
    valid = PART_FLAG_ENCODINGS.get(flag, PART_ENCODINGS)
    out = []
    for item in value.split(","):
        size, _, norm = item.strip().partition(":")
        if not size.strip().isdigit() or int(size) < 1 or not norm.strip():
            raise ConversionError(f"{flag} {value!r}: expected SIZE:ENCODING[,SIZE:ENCODING...] with SIZE >= 1 and "
                                  f"ENCODING one of {', '.join(valid)}, e.g. 6:min_max,1:binary")
        if norm.strip() not in valid:
            raise ConversionError(f"{flag} {value!r}: encoding {norm.strip()!r} is none of {', '.join(valid)}")
        out.append({"size": int(size), "norm": norm.strip()})
    return out


def parse_dims(value: str, flag: str) -> list[int]:
    """``I,J,...`` -> dims (empty string = none)."""
    items = [v.strip() for v in value.split(",") if v.strip()]
    if not all(v.isdigit() for v in items):
        raise ConversionError(f"{flag} {value!r}: expected comma-separated dims (integers >= 0), e.g. 0,1,2, "
                              "or '' for none")
    return [int(v) for v in items]
