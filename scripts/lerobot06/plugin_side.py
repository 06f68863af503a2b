"""The plugin through lerobot 0.6's own API (runs in the lerobot 0.6 side venv).

    python plugin_side.py POLICY_DIR

``POLICY_DIR``: a dit4dit-npu policy folder that ``dit4dit-lerobot-prepare`` has prepared. Checks,
one ``PASS``/``FAIL`` line each (the exit code is the number of FAILs):
  lerobot's plugin discovery registers ``dit4dit`` (``register_third_party_plugins``, as every
    lerobot command runs it first);
  ``make_policy`` + ``make_pre_post_processors`` open the folder as lerobot-eval does (its
    device and rename overrides); a lerobot-shaped batch (float CHW images in [0, 1], the state,
    ``task``) through the preprocessor gives ``predict_action_chunk`` == dit4dit-npu's own
    ``predict_action`` on the same frames (same RNG state);
  ``select_action`` pops the chunk's actions in order and asks the policy again only when the
    queue is empty (after ``n_action_steps``); ``reset`` empties the queue;
  refusals, one line each: a camera lerobot does not send (naming ``--rename_map``), an empty
    task, ``n_action_steps`` longer than the chunk.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
from lerobot.configs.policies import PreTrainedConfig
from lerobot.envs.configs import MetaworldEnv as MetaworldEnvConfig
from lerobot.policies.factory import make_policy, make_pre_post_processors
from lerobot.utils.import_utils import register_third_party_plugins

FAILS: list[str] = []


def check(ok: bool, line: str) -> None:
    print(("PASS " if ok else "FAIL ") + line)
    if not ok:
        FAILS.append(line)


def raises(fn, *words: str) -> str | None:
    """The one-line message of the plugin's error, if ``fn`` raises it and it names ``words``."""
    from lerobot_policy_dit4dit import LeRobotPluginError

    try:
        fn()
    except LeRobotPluginError as e:
        text = str(e)
        return text if "\n" not in text and all(w in text for w in words) else None
    return None


def lerobot_batch(native, rng: np.random.Generator, rows: int = 1) -> tuple[dict, dict]:
    """The same observation twice: as lerobot's env pipeline delivers it and as a robot sends it."""
    h, w = native.image_size
    images = {k: rng.integers(0, 256, (rows, h, w, 3), dtype=np.uint8) for k in native.camera_keys}
    lo, hi = native.io.stats["state"].min, native.io.stats["state"].max
    state = (lo + (hi - lo) * rng.random((rows, native.state_dim))).astype(np.float32)
    task = native.describe().instructions[0]
    batch = {k: torch.from_numpy(v).permute(0, 3, 1, 2).float() / 255 for k, v in images.items()}
    batch |= {"observation.state": torch.from_numpy(state), "task": [task] * rows}
    ours = {**images, "state": state.astype(np.float64), "instruction": [task] * rows}
    return batch, ours


def main(policy_dir: Path) -> int:
    register_third_party_plugins()
    check("dit4dit" in PreTrainedConfig.get_known_choices(),
          "lerobot's plugin discovery (register_third_party_plugins) registers --policy.type=dit4dit")
    cfg = PreTrainedConfig.from_pretrained(policy_dir)
    cfg.pretrained_path = policy_dir
    policy = make_policy(cfg, env_cfg=MetaworldEnvConfig(), rename_map={})
    pre, post = make_pre_post_processors(
        cfg, pretrained_path=str(policy_dir),
        preprocessor_overrides={"device_processor": {"device": str(cfg.device)},
                                "rename_observations_processor": {"rename_map": {}}},
    )
    native = policy.native
    rng = np.random.default_rng(0)
    batch, ours = lerobot_batch(native, rng)
    torch.manual_seed(0)
    chunk = post(policy.predict_action_chunk(pre(dict(batch))))
    torch.manual_seed(0)
    want = native.predict_action(ours)
    check(tuple(chunk.shape) == want.shape and np.allclose(chunk.numpy(), want, atol=1e-6),
          f"make_policy + make_pre_post_processors open {policy_dir.name} ({type(policy).__name__} over dit4dit-npu's, "
          f"cameras {native.camera_keys}); predict_action_chunk on lerobot's batch == predict_action on the same "
          f"frames: {tuple(chunk.shape)}")

    n = policy.n_action_steps
    policy.reset()
    torch.manual_seed(0)
    obs = pre(dict(batch))
    popped = [policy.select_action(obs) for _ in range(n)]
    drained = len(policy._queue)
    policy.select_action(obs)  # the queue is empty: a new chunk, of which one action is taken
    refilled = len(policy._queue)
    first = torch.stack(popped, 1).numpy()
    check(np.allclose(first, want[None, :n], atol=1e-6) and drained == 0 and refilled == n - 1,
          f"select_action pops the chunk's {n} actions in order (queue then {drained}), then refills the queue from "
          f"a new chunk (queue {refilled} after one more action)")
    policy.reset()
    check(len(policy._queue) == 0, "reset empties the action queue")

    no_cam = {k: v for k, v in batch.items() if k != native.camera_keys[0]}
    line = raises(lambda: policy.predict_action_chunk(pre(no_cam)), "--rename_map", native.camera_keys[0])
    check(line is not None, f"a camera lerobot does not send is one line: {line!r}")
    line = raises(lambda: policy.predict_action_chunk(pre({**batch, "task": [""]})), "--policy.instruction")
    check(line is not None, f"an empty task is one line: {line!r}")
    # replace_instruction: the env's task text (here one the policy never saw) gives way to --policy.instruction
    policy.config.instruction, policy.config.replace_instruction = ours["instruction"][0], True
    torch.manual_seed(0)
    swapped = post(policy.predict_action_chunk(pre({**batch, "task": ["a task text the policy never saw"]})))
    policy.config.instruction, policy.config.replace_instruction = None, False
    check(np.allclose(swapped.numpy(), want, atol=1e-6),
          "--policy.replace_instruction=true: --policy.instruction replaces the env's task text (the same chunk as "
          "predict_action given that instruction)")
    from lerobot_policy_dit4dit.configuration_dit4dit import DiT4DiTConfig
    from lerobot_policy_dit4dit.modeling_dit4dit import DiT4DiTPolicy

    line = raises(lambda: DiT4DiTConfig(replace_instruction=True), "--policy.instruction")
    check(line is not None, f"replace_instruction without an instruction is one line: {line!r}")

    too_long = native.chunk_length + 1
    line = raises(lambda: DiT4DiTPolicy._steps(too_long, native.chunk_length), "n_action_steps", str(too_long))
    check(line is not None, f"n_action_steps longer than the chunk is one line: {line!r}")
    return len(FAILS)


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]).resolve()))
