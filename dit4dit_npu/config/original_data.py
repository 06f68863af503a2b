"""Facts about DiT4DiT's data side that its configs refer to by name.

A DiT4DiT config names a dataset mixture (``data_mix: libero_all``); the mixture's robot type
fixes the cameras, the state/action layout and their encodings (its ``data_config.py``). The
config migration (``migrate.py``) expands a mixture into our ``data_mix`` list and our data keys;
the checkpoint import (``dit4dit_npu/convert``) builds a PolicyIO with the robot type's exact
conventions. Only the robot types this project can read and serve are here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# RoboTwin 2.0's 50 tasks, in the order of DiT4DiT's mixtures.
ROBOTWIN_TASKS = (
    "adjust_bottle beat_block_hammer blocks_ranking_rgb blocks_ranking_size click_alarmclock click_bell "
    "dump_bin_bigbin grab_roller handover_block handover_mic hanging_mug lift_pot move_can_pot "
    "move_pillbottle_pad move_playingcard_away move_stapler_pad open_laptop open_microwave "
    "pick_diverse_bottles pick_dual_bottles place_a2b_left place_a2b_right place_bread_basket "
    "place_bread_skillet place_burger_fries place_can_basket place_cans_plasticbox place_container_plate "
    "place_dual_shoes place_empty_cup place_fan place_mouse_pad place_object_basket place_object_scale "
    "place_object_stand place_phone_stand place_shoe press_stapler put_bottles_dustbin put_object_cabinet "
    "rotate_qrcode scan_object shake_bottle shake_bottle_horizontally stack_blocks_three stack_blocks_two "
    "stack_bowls_three stack_bowls_two stamp_seal turn_switch"
).split()

LIBERO_SUITES = ("libero_object", "libero_goal", "libero_spatial", "libero_10")


# The statistics tag GR00T-style data configs give any robot that has no tag of its own: it says
# nothing about the robot, so an import never infers a robot type from it.
GENERIC_TAGS = ("new_embodiment",)


@dataclass(frozen=True)
class RobotType:
    """One robot type of DiT4DiT's data config, as this project reads and serves it.

    Vectors are in the robot's (dataset's) order; ``model_order`` is DiT4DiT's reordering of it
    (model = native[model_order]). Dims are indices in the robot's order. ``conventions`` turns it
    into ``datasets.vla_data`` values (what an import of one of its runs defaults to)."""

    name: str
    tag: str  # the embodiment tag its dataset_statistics.json is keyed by
    cameras: tuple[str, ...]  # LeRobot keys, primary first, then wrists (DiT4DiT tiles them so)
    state_dim: int
    action_dim: int
    # its state keys in the robot's order: (size, encoding) (datasets.vla_data.state_parts)
    state_parts: tuple[tuple[int, str], ...] = ()
    binary_dims: tuple[int, ...] = ()  # on/off dims of state and action (> 0.5 both ways)
    model_order: tuple[int, ...] | None = None
    gripper_dims: tuple[int, ...] = ()  # its client binarized these predicted dims (>= 0.5)
    # what our training config needs for its datasets (migration of a named mixture)
    data_keys: dict[str, Any] = field(default_factory=dict)


ROBOT_TYPES: dict[str, RobotType] = {
    r.name: r
    for r in (
        RobotType(
            name="libero_franka",
            tag="franka",
            cameras=("observation.images.image", "observation.images.wrist_image"),
            state_dim=8,  # x y z roll pitch yaw pad gripper
            action_dim=7,  # x y z roll pitch yaw gripper (the gripper is not normalized)
            state_parts=((1, "sincos"),) * 8,  # its client: [sin x0, cos x0, sin x1, ...]
            gripper_dims=(6,),
            data_keys={
                "camera_keys": ["observation.images.image", "observation.images.wrist_image"],
                "state_norm": "sincos",
            },
        ),
        RobotType(
            name="robotwin",
            tag="new_embodiment",
            cameras=(
                "observation.images.cam_high",
                "observation.images.cam_left_wrist",
                "observation.images.cam_right_wrist",
            ),
            state_dim=14,  # [left 6, left gripper, right 6, right gripper]
            action_dim=14,
            state_parts=((6, "min_max"), (1, "binary"), (6, "min_max"), (1, "binary")),
            binary_dims=(6, 13),
            model_order=(0, 1, 2, 3, 4, 5, 7, 8, 9, 10, 11, 12, 6, 13),  # [L6, R6, Lg, Rg]
            data_keys={
                "camera_keys": [
                    "observation.images.cam_high",
                    "observation.images.cam_left_wrist",
                    "observation.images.cam_right_wrist",
                ],
                "state_norm": "min_max",
            },
        ),
        RobotType(
            name="fourier_gr1_arms_waist",
            tag="gr1",
            cameras=("observation.images.ego_view",),
            state_dim=29,  # left arm 7, right arm 7, left hand 6, right hand 6, waist 3
            action_dim=29,
            state_parts=((7, "sincos"), (7, "sincos"), (6, "sincos"), (6, "sincos"), (3, "sincos")),
            data_keys={"camera_keys": ["observation.images.ego_view"], "state_norm": "sincos"},
        ),
    )
}


# mixture name -> (robot type, [(dataset folder, weight)])
NAMED_MIXTURES: dict[str, tuple[str, list[tuple[str, float]]]] = {
    "libero_all": ("libero_franka", [(f"{s}_no_noops_1.0.0_lerobot", 1.0) for s in LIBERO_SUITES]),
    "robotwin": ("robotwin", [(t, 1.0) for t in ROBOTWIN_TASKS]),
    "robotwin_all": (
        "robotwin",
        [(f"Clean/{t}", 1.0) for t in ROBOTWIN_TASKS] + [(f"Randomized/{t}", 1.0) for t in ROBOTWIN_TASKS],
    ),
}
