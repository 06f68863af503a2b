"""lerobot's pre/post-processor pipelines for a dit4dit-npu policy: no normalization of their own.

The policy's PolicyIO does every transform between robot and model inside ``predict_action``
(crop, resize, state encoding, normalization; actions back in robot units), and it does them on
the same path as training did, so lerobot's pipelines only do what they do for every policy:
rename observation keys (lerobot's ``--rename_map``), add the batch axis, move to the device; and
the actions back to the CPU. The step names are the ones lerobot-eval overrides
(``rename_observations_processor``, ``device_processor``).
"""

from __future__ import annotations

from typing import Any

from lerobot.processor import (
    AddBatchDimensionProcessorStep,
    DeviceProcessorStep,
    PolicyAction,
    PolicyProcessorPipeline,
    RenameObservationsProcessorStep,
)
from lerobot.processor.converters import policy_action_to_transition, transition_to_policy_action
from lerobot.utils.constants import POLICY_POSTPROCESSOR_DEFAULT_NAME, POLICY_PREPROCESSOR_DEFAULT_NAME

from lerobot_policy_dit4dit.configuration_dit4dit import DiT4DiTConfig


def make_dit4dit_pre_post_processors(
    config: DiT4DiTConfig, dataset_stats: Any = None
) -> tuple[PolicyProcessorPipeline[dict[str, Any], dict[str, Any]], PolicyProcessorPipeline[PolicyAction, PolicyAction]]:
    """``dataset_stats`` are ignored: the policy folder carries its training data's statistics."""
    pre = PolicyProcessorPipeline[dict[str, Any], dict[str, Any]](
        steps=[RenameObservationsProcessorStep(rename_map={}), AddBatchDimensionProcessorStep(),
               DeviceProcessorStep(device=config.device)],
        name=POLICY_PREPROCESSOR_DEFAULT_NAME,
    )
    post = PolicyProcessorPipeline[PolicyAction, PolicyAction](
        steps=[DeviceProcessorStep(device="cpu")],
        name=POLICY_POSTPROCESSOR_DEFAULT_NAME,
        to_transition=policy_action_to_transition,
        to_output=transition_to_policy_action,
    )
    return pre, post
