"""A picture of the video model: at a few steps of a recorded demo episode and of
a closed-loop episode of the policy in the ALOHA scene, three rows of frames each:

- **real**: the clip the video loss trains on at that step (the policy's clip offsets, e.g. 0, 4,
  8, 12, 16 steps ahead; clamped to the episode's last frame), views cropped, resized and tiled
  as the model sees them;
- **round trip**: that clip through the VAE (encode -> decode, ``research.reconstruct_video``):
  the best the decoder can show;
- **imagined**: the backbone's predicted future from the step's frame alone
  (``research.predict_video``: frame 0 is the observation's reconstruction).

    python -m dit4dit_npu.eval.video_picture --policy RUN/checkpoints/step_006000/policy \\
        --demos data/aloha/transfer_cube_240x320_recipe --episode 0 --at 0 100 200 \\
        --out docs/aloha_video_model.png

The closed-loop episode is the sim eval's own (``sim.rollout.run_episode``, whole chunks, the
policy's training video size, seed ``--seed``), its frames kept as it runs; it stops after the
last frame the picture needs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from dit4dit_npu.eval.offline import EvalError, build_eval_dataset, observation

TITLE = "real future frames / their VAE round trip / imagined by the video backbone (frame 0: the observation's reconstruction)"


def rows(policy: Any, clip_views: np.ndarray, obs: Any, steps: int, seed: int) -> list[tuple[str, np.ndarray]]:
    """[("real", ...), ("round trip", ...), ("imagined", ...)] for one clip of views (T, V, H, W, 3)
    and the parsed observation of its frame 0; each (T, H, W_tiled, 3) uint8."""
    from dit4dit_npu.eval.research import predict_video, reconstruct_video
    from dit4dit_npu.transforms.images import untile

    real = untile(policy.io.frames(clip_views).numpy())
    return [
        ("real", real),
        ("round trip", reconstruct_video(policy, clip_views)),
        ("imagined", predict_video(policy, obs, steps=steps, seed=seed)[0]),
    ]


def demo_strips(policy: Any, root: Path, episode: int, at: list[int], steps: int, seed: int) -> list:
    """The strips of steps ``at`` of demo ``episode``: its clips as training reads them."""
    ds = build_eval_dataset(policy, [(root, [episode])])
    if any(t >= len(ds) for t in at):
        raise EvalError(f"--at {at}: demo episode {episode} of {root} has {len(ds)} steps")
    strips = []
    for t in at:
        s = ds.raw_sample(t)  # one episode selected: sample t is its frame t
        strips.append((f"demo {root.name} ep{episode} t={s.frame}", rows(policy, s.views, observation([s]), steps, seed)))
    return strips


class FrameRecorder:
    """Takes the place of the sim eval's video writer: keeps every step's camera images."""

    def __init__(self, cameras: list[str]) -> None:
        self.cameras = cameras
        self.frames: list[dict[str, np.ndarray]] = []

    def write(self, frame: np.ndarray) -> None:  # the cameras side by side, in scene order
        self.frames.append(dict(zip(self.cameras, np.split(frame, len(self.cameras), axis=1))))


def closed_loop_strips(policy_dir: str, task: str, seed: int, at: list[int], steps: int) -> tuple[Any, list, dict]:
    """(the loaded policy, the strips of steps ``at`` of one closed-loop episode, its result)."""
    from dit4dit_npu.data.robotwin import clip_rows
    from dit4dit_npu.sim.rollout import EvalSetup, Worker, run_episode
    from dit4dit_npu.transforms.observation import Observation

    worker = Worker(EvalSetup(task=task, policy=policy_dir, max_steps=1, replan=None, size_hw=None))
    try:
        policy = worker.policy.policy
        offsets = np.asarray(policy.io.clip_offsets)
        recorder = FrameRecorder(list(worker.scene.cameras))
        # whole chunks as the sim eval runs them, until the last frame the picture shows
        result = run_episode(worker.scene, worker.policy, seed, max(at) + int(offsets.max()), None, recorder)
        instruction = worker.scene.instruction
    finally:
        worker.close()
    frames = recorder.frames
    if result["error"] is not None or any(t >= len(frames) for t in at):
        raise EvalError(f"--at {at}: the closed-loop episode (seed {seed}) ended after {len(frames)} frames ({result['error'] or 'success'})")
    strips = []
    for t in at:
        clip = clip_rows(t, offsets, 0, len(frames))
        views = np.stack([np.stack([policy.io.view(k, frames[i][k]) for k in policy.io.camera_keys]) for i in clip])
        # the imagined clip reads the views and the instruction only: the state is not recorded here
        obs = Observation(views=views[:1], state=np.zeros((1, policy.io.state_dim)), instructions=[instruction], batched=True)
        strips.append((f"closed loop seed {seed} t={t}", rows(policy, views, obs, steps, seed)))
    return policy, strips, result


def motion_line(title: str, clips: list[tuple[str, np.ndarray]]) -> str:
    """Does the imagined future move? Mean absolute pixel error (0-255) of the imagined frames
    1.. against the round trip of the real ones (the most the decoder could show), beside that of
    the round trip's frame 0 held still (what a blurred copy of the observation scores)."""
    c = dict(clips)
    if len(c["real"]) < 2:
        return f"{title}: one-frame clips, no future to compare"
    target = c["round trip"][1:].astype(np.float64)
    imagined = np.abs(c["imagined"][1:] - target).mean()
    held = np.abs(c["round trip"][:1] - target).mean()
    change = np.abs(c["imagined"][1:].astype(np.float64) - c["imagined"][:1]).mean()
    return (f"{title}: imagined {imagined:.2f}, frame 0 held {held:.2f}; the imagined frames differ from "
            f"their frame 0 by {change:.2f}")


if __name__ == "__main__":  # python -m dit4dit_npu.eval.video_picture: the command is eval/cli.py's
    from dit4dit_npu.eval.cli import video_picture_main

    raise SystemExit(video_picture_main())
