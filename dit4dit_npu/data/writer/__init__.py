"""Write a LeRobot dataset (v2.1 or v3.0) from arrays and RGB frames: the demo's back end.

Files and metadata follow lerobot's layouts (docs/data.md, "Interoperability with lerobot"): lerobot
0.4.4's LeRobotDataset, v2.1->v3.0 converter, visualizer and trainer accept them unchanged
(``scripts/interop_check.sh`` checks with the real library), and starVLA reads them. Statistics
(``lerobot_stats``) cover every feature, cameras included, per episode and for the dataset, as
lerobot's ``compute_episode_stats`` lays them out.

``common.py`` holds what both versions share (``LeRobotWriter``: one episode at a time, bounded
memory for simulation demos; ``write_lerobot_dataset``: arrays already in memory); ``v21.py`` and
``v30.py`` each version's files. ``LeRobotWriter(root, version, spec)`` picks the version's writer.
"""

from dit4dit_npu.data.writer.common import (
    DatasetSpec,
    Episode,
    LeRobotWriter,
    aloha_modality,
    write_lerobot_dataset,
)
from dit4dit_npu.data.writer.v21 import V21Writer
from dit4dit_npu.data.writer.v30 import V30Writer

__all__ = ["DatasetSpec", "Episode", "LeRobotWriter", "V21Writer", "V30Writer", "aloha_modality", "write_lerobot_dataset"]
