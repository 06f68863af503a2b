"""Inference: ``DiT4DiTPolicy`` (robot-unit ``predict_action``) and the exported policy folder.

    from dit4dit_npu.policy import DiT4DiTPolicy
    policy = DiT4DiTPolicy.from_pretrained("runs/<run_id>/checkpoints/step_005000/policy")

``folder`` owns the on-disk format (what a checkpoint exports, how it is read back), ``manifest``
its policy.json and ``legacy`` the older format versions; ``policy`` wraps a loaded model with its
PolicyIO for robots, servers and evaluation, built from parts it owns: ``requests`` (its request
checks), ``instructions`` (its run-time prompt-cache additions), ``rtc`` (real-time chunking
requests, parsed there once); ``contract`` is the small interface a server calls. Each error class
is defined beside the code that raises it and exported here.
"""

from dit4dit_npu.policy.contract import ModelSpaceRequest
from dit4dit_npu.policy.folder import PolicyLoadError, UnverifiedPolicyWarning, export_policy
from dit4dit_npu.policy.manifest import FORMAT_VERSION, PolicyManifest
from dit4dit_npu.policy.policy import (
    DiT4DiTPolicy,
    NonFiniteActionError,
    OutOfRangeError,
    OutOfRangeWarning,
    PolicyInputError,
    PrevChunkOutOfRangeError,
    PrevChunkRangeWarning,
    StateOutOfRangeError,
    StateRangeWarning,
)
from dit4dit_npu.policy.rtc import RTCRequest

__all__ = [
    "FORMAT_VERSION", "DiT4DiTPolicy", "ModelSpaceRequest", "NonFiniteActionError", "PolicyInputError",
    "PolicyLoadError", "OutOfRangeError", "OutOfRangeWarning", "PolicyManifest", "PrevChunkOutOfRangeError",
    "PrevChunkRangeWarning", "RTCRequest", "StateOutOfRangeError", "StateRangeWarning", "UnverifiedPolicyWarning",
    "export_policy",
]
