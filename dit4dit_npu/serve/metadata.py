"""The metadata the server sends on connect: everything a client needs to build a request.

Machine-readable first (keys, shapes, widths, sizes), with one short text per layout. The
policy's own metadata (``DiT4DiTPolicy.metadata``: cameras, dims, chunk, step, instructions) is
kept as is; the server adds the layouts it accepts, the DiT4DiT model-space layout, the whole
PolicyIO (its statistics and pipelines, so a client that normalizes itself has the numbers) and
its own limits.
"""

from __future__ import annotations

from typing import Any

from dit4dit_npu.serve.session import RTC_KEYS
from dit4dit_npu.transforms.observation import CAMERA_PREFIX


def server_metadata(
    policy_meta: dict[str, Any],
    io: Any,
    *,
    max_message_bytes: int,
    max_batch: int,
    batch_window_ms: float,
    new_instructions: int | str | None,
    limits: Any,
    out_of_range_state: str,
) -> dict[str, Any]:
    h, w = io.image_size
    spec = io.spec
    cameras = list(io.camera_keys)
    short = {k.removeprefix(CAMERA_PREFIX): k for k in cameras}
    return {
        **policy_meta,
        "max_message_bytes": max_message_bytes,
        "action_shape": [io.chunk_length, io.action_dim],  # float32, robot units (a batch adds a leading axis)
        "observation_layouts": {
            "dit4dit_npu": {
                "keys": [*cameras, "state", "instruction"],
                "image": f"uint8 (H, W, 3) RGB; resized to {h}x{w} if its aspect ratio is the training videos'"
                + (f"; whole camera frames: {sorted(io.camera_crops)} are cropped first (camera_crops)"
                   if io.camera_crops else ""),
                "state": [io.state_dim],
                "instruction": "str ('prompt' is accepted instead)",
            },
            "openpi": {
                "keys": ["images", "state", "prompt"],
                "images": short,  # openpi camera name -> our camera key
                "image": "uint8 (3, H, W) or (H, W, 3) RGB",
                "state": [io.state_dim],
                "prompt": "str",
            },
            "batched": "a leading batch axis B on every image and the state; instruction a str or B strs",
            "seed": "optional int in [0, 2**63): the same seed and observation give the same actions",
            "rtc": {  # real-time chunking (serve/session.py; README "Real-time chunking")
                "keys": list(RTC_KEYS),
                "executed": "int: actions of this connection's last chunk executed when the observation was taken",
                "prev_chunk": f"or float (L, {io.action_dim}) robot units: the previous chunk's actions still to come",
                "inference_delay": "int control steps until this chunk executes; default: estimated from control_hz",
            },
        },
        "dit4dit_examples": {  # DiT4DiT's own protocol: model-space in, normalized out
            "image": [*spec.frame_size, 3],
            "view_size": [h, w],
            "view_order": cameras,
            "view_layout": io.view_layout,
            "state": [1, spec.state_width],
            "reply": f"data.normalized_actions float32 (B, {spec.chunk_length}, {spec.action_width}), "
            "normalized, padded dims included",
        },
        "policy_io": io.to_dict(),
        "batching": {"max_batch": max_batch, "window_ms": batch_window_ms},
        # per request, checked before decoding: rows (batch axis / DiT4DiT examples) and the bytes
        # its images take once decoded and resized to the model's size
        "request_limits": {"max_rows": limits.max_rows, "max_decoded_bytes": limits.max_decoded_bytes},
        # a state far outside the training range: "refused" or "answered with warnings" (the
        # reply's "warnings": [line, ...])
        "out_of_range_state": out_of_range_state,
        # "refused" (only training instructions), an int (new ones kept, least recently used dropped
        # beyond it) or None (no cap)
        "new_instructions": new_instructions,
    }
