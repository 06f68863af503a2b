"""``DiT4DiTPolicy`` for lerobot: a dit4dit-npu policy folder behind lerobot's policy interface.

Thin on purpose: the folder loads through dit4dit-npu's own ``DiT4DiTPolicy.from_pretrained``,
and every observation goes through its ``predict_action`` (the PolicyIO parses, resizes,
normalizes, and returns actions in robot units), so lerobot's pipelines around it carry no
normalization of their own (processor_dit4dit.py). Chunks execute the way lerobot executes chunked
policies (ACT, pi0): ``select_action`` pops one action from a queue, refilled with the first
``n_action_steps`` actions of a new ``predict_action`` chunk when empty; ``reset`` empties it.
"""

from __future__ import annotations

from collections import deque
from pathlib import Path
from typing import Any

import torch
from lerobot.policies.pretrained import PreTrainedPolicy
from torch import Tensor

from dit4dit_npu.policy import DiT4DiTPolicy as NativePolicy
from lerobot_policy_dit4dit.configuration_dit4dit import TRAIN_WITH, TYPE, DiT4DiTConfig, LeRobotPluginError
from lerobot_policy_dit4dit.observation import observation


class DiT4DiTPolicy(PreTrainedPolicy):
    config_class = DiT4DiTConfig
    name = TYPE

    def __init__(self, config: DiT4DiTConfig, native: NativePolicy | None = None, **kwargs: Any) -> None:
        super().__init__(config)
        if native is None:  # lerobot builds a policy from scratch only to train it
            raise LeRobotPluginError(f"policy.type={TYPE}: needs a policy folder (--policy.path=DIR); {TRAIN_WITH}")
        self.native = native
        self.model = native.model  # registered, so lerobot's .to(), .eval() and parameter counts see it
        self.n_action_steps = self._steps(config.n_action_steps, native.chunk_length)
        self._queue: deque[Tensor] = deque()

    @staticmethod
    def _steps(n: int | None, chunk_length: int) -> int:
        if n is None:
            return chunk_length
        if not 1 <= n <= chunk_length:
            raise LeRobotPluginError(f"policy.n_action_steps: got {n}, expected 1 to the policy's chunk_length {chunk_length}")
        return n

    @classmethod
    def from_pretrained(cls, pretrained_name_or_path: str | Path, *, config: DiT4DiTConfig | None = None,
                        **kwargs: Any) -> DiT4DiTPolicy:
        """A dit4dit-npu policy folder (with the files ``dit4dit-lerobot-prepare`` adds for lerobot)."""
        path = Path(pretrained_name_or_path)
        if config is None:
            config = DiT4DiTConfig.from_pretrained(path)
        native = NativePolicy.from_pretrained(path, device=config.device, base_model=config.base_model)
        policy = cls(config, native=native)
        policy.eval()
        return policy

    def get_optim_params(self) -> dict:
        raise LeRobotPluginError(f"policy.type={TYPE}: lerobot cannot train a DiT4DiT policy; {TRAIN_WITH}")

    def forward(self, batch: dict[str, Tensor]) -> tuple[Tensor, dict | None]:
        raise LeRobotPluginError(f"policy.type={TYPE}: lerobot cannot train a DiT4DiT policy; {TRAIN_WITH}")

    def reset(self) -> None:
        self._queue.clear()

    @torch.no_grad()
    def predict_action_chunk(self, batch: dict[str, Tensor], **kwargs: Any) -> Tensor:
        """(B, chunk_length, action_dim) robot-unit actions: one ``predict_action`` call."""
        obs = observation(batch, self.native.camera_keys, self.config.instruction, self.config.replace_instruction)
        actions = self.native.predict_action(obs, allow_out_of_range=self.config.allow_out_of_range)
        return torch.from_numpy(actions).float().to(self.native.device)

    @torch.no_grad()
    def select_action(self, batch: dict[str, Tensor], **kwargs: Any) -> Tensor:
        """(B, action_dim): the next queued action; an empty queue asks the policy for a chunk."""
        if not self._queue:
            chunk = self.predict_action_chunk(batch)[:, : self.n_action_steps]
            self._queue.extend(chunk.transpose(0, 1))  # the queue runs over time, each item (B, action_dim)
        return self._queue.popleft()
