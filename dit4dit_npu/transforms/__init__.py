"""Every transform between robot data and model tensors, composed into one ``PolicyIO``.

``feature_stats`` (FeatureStats: what normalization is computed from), ``vector`` (pure state/action
steps: Normalize, SinCos, Pad, composed into a VectorPipeline), ``images`` (crop, resize and view
tiling primitives), ``steps`` (PolicyIO's ordered steps: CropViews, ResizeViews, TileViews,
EncodeState, EncodeAction, each serializing itself), ``observation`` (a robot's observation dict
-> checked arrays) and ``policy_io`` (PolicyIO: the steps the dataset, the policy and eval all
call, saved with every checkpoint as policy_io.json by ``policy_io_json``).
"""

from dit4dit_npu.transforms.feature_stats import FeatureStats, merge_stats, pool_moments
from dit4dit_npu.transforms.observation import PolicyInputError
from dit4dit_npu.transforms.policy_io import PolicyIO, PolicyIOError
from dit4dit_npu.transforms.steps import CropViews, EncodeAction, EncodeState, ResizeViews, TileViews
from dit4dit_npu.transforms.vector import Normalize, Pad, SinCos, VectorPipeline

__all__ = [
    "CropViews",
    "EncodeAction",
    "EncodeState",
    "FeatureStats",
    "Normalize",
    "Pad",
    "PolicyIO",
    "PolicyIOError",
    "PolicyInputError",
    "ResizeViews",
    "SinCos",
    "TileViews",
    "VectorPipeline",
    "merge_stats",
    "pool_moments",
]
