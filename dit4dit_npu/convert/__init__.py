"""Import of checkpoints from other implementations into policy folders.

``dit4dit`` (``python -m dit4dit_npu.convert dit4dit ...``): an original DiT4DiT run (its
``steps_N_pytorch_model.pt``, ``config.yaml`` and ``dataset_statistics.json``) -> a policy folder
(``dit4dit_npu/policy/folder.py``) with the original's conventions as options. ``checkpoint``
reads and renames the state dict and checks its frozen parts against the base model;
``embodiment`` turns the statistics and the robot type into a PolicyIO.
"""

from dit4dit_npu.convert.checkpoint import ConversionError
from dit4dit_npu.convert.dit4dit import convert_dit4dit

__all__ = ["ConversionError", "convert_dit4dit"]
