"""The opt-in ``torch.compile`` of the video backbone's transformer blocks: ``trainer.compile`` for
training (``train/loop.py``), ``DiT4DiTPolicy.from_pretrained(compile=True)`` / ``--compile`` for
inference. Off by default.

Applied to the built model from outside it, as torchtitan applies compile in its parallelize step:
``models/`` stays plain torch. Each block is compiled on its own (``nn.Module.compile``, in place),
not the whole model: a graph break stays inside one block, the rest of the step (VAE encode,
action head, the loss) runs eager as before, and parameter names, state_dict keys, checkpoints and
exported policies are unchanged. The blocks are one class with one ``forward``, so dynamo compiles
the block once per input signature and every block reuses it: the warm-up does not grow with depth.

What compiles when (each is a one-off warm-up, then cached for the process): the first training
step compiles the no-grad feature pass and the video pass with its backward; inference compiles
once for eval mode. Shapes: the frame size, clip length and prompt length are fixed by the model's
``BatchSpec``; only the batch size varies (the server's batching, an evaluation's last batch). With
torch's default (automatic dynamic shapes) the second batch size seen recompiles once with the
batch dim symbolic and later sizes reuse that graph (batch 1 is always its own graph: torch
specializes 0 and 1). Measured (the small test config, batch 1 to 5 in turn): with
``dynamic=False`` every new batch size recompiled; with the default, only the second did. Past
torch's recompile limit (``torch._dynamo.config``, 8 by default) the block's forward runs eager
with torch's warning, so recompiles never grow without bound.
"""

from __future__ import annotations

from torch import nn

from dit4dit_npu import device as dev


def check_compile(key: str) -> None:
    """Refuse ``key`` (the config key or argument that asked for compile) with one line where this
    host cannot compile (``device.compile_problem``: Ascend NPU not verified yet, no C++ compiler on
    CPU, no triton on CUDA): before anything heavy runs."""
    problem = dev.compile_problem()
    if problem is not None:
        raise dev.DeviceError(f"{key}: {problem}; set it off")


def compile_backbone(model: nn.Module, key: str) -> int:
    """Compile each transformer block of ``model``'s video backbone (a ``DiT4DiT``) in place, lazily:
    nothing compiles before the first call. Returns the number of blocks."""
    check_compile(key)
    blocks = model.backbone.transformer.transformer_blocks
    for block in blocks:
        block.compile()  # automatic dynamic shapes (see above); fullgraph off: a break stays in the block
    return len(blocks)
