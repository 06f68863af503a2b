"""The metadata the server sends on connect: everything a client needs to build a request.

Each fact once: the policy's description (``PolicyDescription.metadata()``: cameras, sizes, dims,
chunk, step, instructions, its policy_io.json) at the top level, where clients read it
(``camera_keys``, ``chunk_length``, ``image_size``, ``action_shape``, ...), plus what only the
server knows: the layouts it accepts (described in terms of those keys), the DiT4DiT model-space
protocol, and its own limits.
"""

from __future__ import annotations

from typing import Any

from dit4dit_npu.policy.rtc import RTC_KEYS
from dit4dit_npu.transforms.observation import CAMERA_PREFIX


def server_metadata(
    policy: Any,
    *,
    max_message_bytes: int,
    max_batch: int,
    batch_window_ms: float,
    new_instructions: int | str | None,
    limits: Any,
    out_of_range_state: str,
) -> dict[str, Any]:
    """``policy``: the policy's ``PolicyDescription``."""
    h, w = policy.image_size
    short = {k.removeprefix(CAMERA_PREFIX): k for k in policy.camera_keys}
    crops = f"; whole camera frames: {sorted(policy.camera_crops)} are cropped first (camera_crops)"
    return {
        **policy.metadata(),
        "max_message_bytes": max_message_bytes,
        "observation_layouts": {
            "dit4dit_npu": {
                "keys": "observation_keys",
                "image": f"uint8 (H, W, 3) RGB; resized to image_size {h}x{w} if its aspect ratio is the training "
                "videos' (source_image_sizes)" + (crops if policy.camera_crops else ""),
                "state": "(state_dim,) robot units, unpadded",
                "instruction": "str ('prompt' is accepted instead)",
            },
            "openpi": {
                "keys": ["images", "state", "prompt"],
                "images": short,  # openpi camera name -> our camera key
                "image": "uint8 (3, H, W) or (H, W, 3) RGB",
                "prompt": "str",
            },
            "batched": "a leading batch axis B on every image and the state; instruction a str or B strs",
            "seed": "optional int in [0, 2**63): the same seed and observation give the same actions",
            "rtc": {  # real-time chunking (serve/session.py; docs/serving.md)
                "keys": list(RTC_KEYS),
                "executed": "int: actions of this connection's last chunk executed when the observation was taken",
                "prev_chunk": "or float (L, action_dim) robot units: the previous chunk's actions still to come",
                "inference_delay": "int control steps until this chunk executes; default: estimated from control_hz",
            },
        },
        "dit4dit_examples": {  # DiT4DiT's own protocol: model-space in, normalized out
            "image": [*policy.frame_size, 3],  # the views resized and tiled (policy_io's steps)
            "state": [1, policy.state_width],
            "reply": f"data.normalized_actions float32 (B, {policy.chunk_length}, {policy.action_width}), "
            "normalized, padded dims included",
        },
        "batching": {"max_batch": max_batch, "window_ms": batch_window_ms},
        # per request, checked before decoding: rows (batch axis / DiT4DiT examples) and the bytes
        # its images take once decoded and resized to the model's size
        "request_limits": {"max_rows": limits.max_rows, "max_decoded_bytes": limits.max_decoded_bytes},
        # a state or an rtc prev_chunk far outside the training range: "refused" or "answered with
        # warnings" (the reply's "warnings": [line, ...]); the key's name is from when only the
        # state was checked (clients read it)
        "out_of_range_state": out_of_range_state,
        # "refused" (only training instructions), an int (new ones kept, least recently used dropped
        # beyond it) or None (no cap)
        "new_instructions": new_instructions,
    }
