"""The typed run config: ``schema`` (dataclasses, one per YAML section) and ``loader`` (YAML +
dotted overrides -> validated ``Config``, one-line ``ConfigError``s)."""

from dit4dit_npu.config.loader import (
    ConfigError,
    dump_yaml,
    from_dict,
    load_config,
    parse_overrides,
    read_yaml,
    save_config,
    to_dict,
    validate,
)
from dit4dit_npu.config.schema import *  # noqa: F403  (the dataclasses: schema.__all__)
from dit4dit_npu.config.schema import __all__ as _SCHEMA

__all__ = [
    *_SCHEMA,
    "ConfigError",
    "dump_yaml",
    "from_dict",
    "load_config",
    "parse_overrides",
    "read_yaml",
    "save_config",
    "to_dict",
    "validate",
]
