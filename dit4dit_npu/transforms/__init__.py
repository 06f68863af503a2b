"""Every transform between robot data and model tensors, composed into one ``PolicyIO``.

``feature_stats`` (FeatureStats: what normalization is computed from), ``vector`` (pure state/action
steps: Normalize, SinCos, Pad, composed into a VectorPipeline), ``images`` (the one resize path
and view tiling), ``observation`` (a robot's observation dict -> checked arrays) and
``policy_io`` (PolicyIO: the composition the dataset, the policy and eval all call, saved with
every checkpoint).
"""

from dit4dit_npu.transforms.feature_stats import FeatureStats, merge_stats, pool_moments
from dit4dit_npu.transforms.observation import PolicyInputError
from dit4dit_npu.transforms.policy_io import PolicyIO, PolicyIOError
from dit4dit_npu.transforms.vector import Normalize, Pad, SinCos, VectorPipeline

__all__ = [
    "FeatureStats",
    "Normalize",
    "Pad",
    "PolicyIO",
    "PolicyIOError",
    "PolicyInputError",
    "SinCos",
    "VectorPipeline",
    "merge_stats",
    "pool_moments",
]
