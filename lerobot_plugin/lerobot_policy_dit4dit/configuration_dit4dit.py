"""``--policy.type=dit4dit``: lerobot's config of a dit4dit-npu policy folder.

Everything the model needs (cameras, image size, state and action widths, chunk length,
normalization) is the policy folder's own (its PolicyIO), read when the policy loads; this config
holds only how lerobot drives it. lerobot finds the policy class by naming convention: the config
``DiT4DiTConfig`` in ``configuration_dit4dit`` -> ``DiT4DiTPolicy`` in ``modeling_dit4dit`` and
``make_dit4dit_pre_post_processors`` in ``processor_dit4dit``.
"""

from __future__ import annotations

from dataclasses import dataclass

from lerobot.configs import PreTrainedConfig

from dit4dit_npu.errors import DiT4DiTError

TYPE = "dit4dit"
TRAIN_WITH = "train with `python -m dit4dit_npu.train` and evaluate its policy folder with --policy.path"


class LeRobotPluginError(DiT4DiTError, ValueError):
    """A setting or an input lerobot passes that a DiT4DiT policy cannot take (one line)."""


@PreTrainedConfig.register_subclass(TYPE)
@dataclass
class DiT4DiTConfig(PreTrainedConfig):
    # Actions of each predicted chunk executed before the next prediction (lerobot's name, as
    # ACT's and pi0's); None: the whole chunk (the policy's chunk_length).
    n_action_steps: int | None = None
    # Replaces the base model path recorded in the policy folder (the frozen Cosmos weights are
    # referred to by path, never copied): for a folder moved to another machine.
    base_model: str | None = None
    # Act on states far outside the training range (with a warning) instead of refusing them.
    allow_out_of_range: bool = False
    # The instruction when the environment gives none (lerobot sends an empty "task" then).
    instruction: str | None = None
    # true: `instruction` replaces the environment's task text on every observation, given or not.
    # A language test: one task's scene with another task's instruction (both must be in the
    # policy's prompt cache, or its text encoder must be at hand).
    replace_instruction: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.n_action_steps is not None and self.n_action_steps < 1:
            raise LeRobotPluginError(f"policy.n_action_steps: got {self.n_action_steps}, expected >= 1 (or null: the whole chunk)")
        if self.replace_instruction and not self.instruction:
            raise LeRobotPluginError("policy.replace_instruction=true needs --policy.instruction='<the instruction to give instead>'")

    # Evaluation only: lerobot-train would need these, and training is dit4dit-npu's own.
    @property
    def observation_delta_indices(self) -> None:
        return None

    @property
    def action_delta_indices(self) -> None:
        return None

    @property
    def reward_delta_indices(self) -> None:
        return None

    def get_optimizer_preset(self):  # noqa: ANN201 (lerobot's OptimizerConfig; never returned)
        raise LeRobotPluginError(f"policy.type={TYPE}: lerobot-train cannot train a DiT4DiT policy; {TRAIN_WITH}")

    def get_scheduler_preset(self) -> None:
        return None

    def validate_features(self) -> None:
        """The policy folder checks its inputs itself, on every observation (its PolicyIO)."""
