"""The one batch schema shared by data/, models/, train/, eval and serve.

A batch is a plain ``dict[str, Tensor | list[str]]`` (never a list of per-sample dicts):

=================  ==========================================  ====================================
key                shape / dtype                               meaning
=================  ==========================================  ====================================
``frames``         (B, T, V, 3, H, W) uint8 in [0, 255]        T clip frames (already subsampled by
                   or float in [0, 1]                          ``action_video_freq_ratio``; frame 0
                                                               is the current observation), V camera
                                                               views in config order, each H x W.
                                                               At inference T == 1.
``instruction``    list[str] of length B                       task text (prompt-cache key)
``state``          (B, max_state_dim) float32                  current state, already encoded
                                                               (normalized or sin/cos) and zero-padded
``action``         (B, H_a, max_action_dim) float32            normalized action chunk, zero-padded
                                                               (training only)
``action_mask``    (B, H_a, max_action_dim) bool               True on real action dims
                                                               (training only)
``frames_is_pad``  (B, T) bool                                 clip frames clamped at the episode end
                                                               (optional, informational)
=================  ==========================================  ====================================

H_a = ``framework.action_model.future_action_window_size + 1``.
"""

from __future__ import annotations

FRAMES = "frames"
INSTRUCTION = "instruction"
STATE = "state"
ACTION = "action"
ACTION_MASK = "action_mask"
FRAMES_IS_PAD = "frames_is_pad"

TRAINING_KEYS = (FRAMES, INSTRUCTION, STATE, ACTION, ACTION_MASK)
INFERENCE_KEYS = (FRAMES, INSTRUCTION, STATE)
