"""DiT4DiT as a lerobot 0.6 policy (``--policy.type=dit4dit``).

lerobot imports this package (every installed ``lerobot_policy_*`` distribution) before it parses
a command line; importing the config module registers the type with lerobot's
``PreTrainedConfig`` registry. The policy and processor modules load when lerobot asks for them
(its naming convention: configuration_dit4dit -> modeling_dit4dit, processor_dit4dit).
"""

from lerobot_policy_dit4dit.configuration_dit4dit import DiT4DiTConfig, LeRobotPluginError

__all__ = ["DiT4DiTConfig", "LeRobotPluginError"]
