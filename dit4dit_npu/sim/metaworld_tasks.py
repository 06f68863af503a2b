"""The Meta-World tasks the sim eval knows (``--task metaworld/<task>``), light on purpose.

No ``metaworld`` or MuJoCo import here: the eval checks ``--task`` before the simulator loads.
The facts are lerobot 0.6.1's Meta-World env's (``lerobot/envs/metaworld.py`` and its
``metaworld_config.json``), because a policy trained on lerobot's observations must be shown the
same ones here, or its score here cannot agree with ``lerobot-eval``'s:

- the instruction of a task is lerobot's description of it (what the demos recorded as each
  episode's task, and so what the policy's prompt cache holds);
- one camera, ``corner2``, delivered as lerobot's ``observation.image``; the state is lerobot's
  ``agent_pos`` (hand xyz and gripper opening, the first 4 numbers of Meta-World's observation);
  the action is Meta-World's (hand xyz displacement and gripper, in [-1, 1]);
- an episode ends at success (``info["success"]``) or after 500 steps, Meta-World's
  ``max_path_length`` (stepping past it is an error in Meta-World itself);
- the env runs at 80 Hz (frame_skip 5 x 2.5 ms; lerobot's ``render_fps``).
"""

from __future__ import annotations

from dit4dit_npu.sim.errors import SimError

PREFIX = "metaworld/"  # --task metaworld/reach-v3: the simulator, then Meta-World's own task name
INSTALL_HELP = "install it: pip install 'metaworld==3.0.0' (or the simulation extra: pip install -e '.[sim]')"
MAX_STEPS = 500  # Meta-World's max_path_length; lerobot's MetaworldEnv._max_episode_steps
FPS = 80  # lerobot's MetaworldEnv.metadata["render_fps"]
CAMERA_KEY = "observation.image"  # lerobot's key for the env's one camera (preprocess_observation)
CAMERA = "corner2"  # lerobot's default camera_name
DEFAULT_SIZE = (480, 480)  # what lerobot's stock env renders, for a policy that does not say its size
STATE_DIM = ACTION_DIM = 4  # agent_pos [hand x, y, z, gripper]; action [dx, dy, dz, gripper]
MT10 = (
    "reach-v3", "push-v3", "pick-place-v3", "door-open-v3", "drawer-open-v3", "drawer-close-v3",
    "button-press-topdown-v3", "peg-insert-side-v3", "window-open-v3", "window-close-v3",
)

# lerobot 0.6.1's TASK_DESCRIPTIONS (lerobot/envs/metaworld_config.json): every Meta-World v3 task
DESCRIPTIONS = {
    "assembly-v3": "Pick up a nut and place it onto a peg",
    "basketball-v3": "Dunk the basketball into the basket",
    "bin-picking-v3": "Grasp the puck from one bin and place it into another bin",
    "box-close-v3": "Grasp the cover and close the box with it",
    "button-press-topdown-v3": "Press a button from the top",
    "button-press-topdown-wall-v3": "Bypass a wall and press a button from the top",
    "button-press-v3": "Press a button",
    "button-press-wall-v3": "Bypass a wall and press a button",
    "coffee-button-v3": "Push a button on the coffee machine",
    "coffee-pull-v3": "Pull a mug from a coffee machine",
    "coffee-push-v3": "Push a mug under a coffee machine",
    "dial-turn-v3": "Rotate a dial 180 degrees",
    "disassemble-v3": "Pick a nut out of a peg",
    "door-close-v3": "Close a door with a revolving joint",
    "door-lock-v3": "Lock the door by rotating the lock clockwise",
    "door-open-v3": "Open a door with a revolving joint",
    "door-unlock-v3": "Unlock the door by rotating the lock counter-clockwise",
    "hand-insert-v3": "Insert the gripper into a hole",
    "drawer-close-v3": "Push and close a drawer",
    "drawer-open-v3": "Open a drawer",
    "faucet-open-v3": "Rotate the faucet counter-clockwise",
    "faucet-close-v3": "Rotate the faucet clockwise",
    "hammer-v3": "Hammer a screw on the wall",
    "handle-press-side-v3": "Press a handle down sideways",
    "handle-press-v3": "Press a handle down",
    "handle-pull-side-v3": "Pull a handle up sideways",
    "handle-pull-v3": "Pull a handle up",
    "lever-pull-v3": "Pull a lever down 90 degrees",
    "peg-insert-side-v3": "Insert a peg sideways",
    "pick-place-wall-v3": "Pick a puck, bypass a wall and place the puck",
    "pick-out-of-hole-v3": "Pick up a puck from a hole",
    "reach-v3": "Reach a goal position",
    "push-back-v3": "Push the puck to a goal",
    "push-v3": "Push the puck to a goal",
    "pick-place-v3": "Pick and place a puck to a goal",
    "plate-slide-v3": "Slide a plate into a cabinet",
    "plate-slide-side-v3": "Slide a plate into a cabinet sideways",
    "plate-slide-back-v3": "Get a plate from the cabinet",
    "plate-slide-back-side-v3": "Get a plate from the cabinet sideways",
    "peg-unplug-side-v3": "Unplug a peg sideways",
    "soccer-v3": "Kick a soccer into the goal",
    "stick-push-v3": "Grasp a stick and push a box using the stick",
    "stick-pull-v3": "Grasp a stick and pull a box with the stick",
    "push-wall-v3": "Bypass a wall and push a puck to a goal",
    "reach-wall-v3": "Bypass a wall and reach a goal",
    "shelf-place-v3": "Pick and place a puck onto a shelf",
    "sweep-into-v3": "Sweep a puck into a hole",
    "sweep-v3": "Sweep a puck off the table",
    "window-open-v3": "Push and open a window",
    "window-close-v3": "Push and close a window",
}


def is_metaworld(task: str) -> bool:
    return task.startswith(PREFIX)


def env_name(task: str) -> str:
    """``metaworld/reach-v3`` -> ``reach-v3`` (Meta-World's own name); an unknown one is one line."""
    name = task[len(PREFIX):]
    if name not in DESCRIPTIONS:
        raise SimError(
            f"--task {task}: unknown Meta-World task {name!r}; expected {PREFIX}<task> with one of Meta-World's "
            f"{len(DESCRIPTIONS)} v3 tasks (MT10: {', '.join(MT10)}; all: {', '.join(sorted(DESCRIPTIONS))})"
        )
    return name
