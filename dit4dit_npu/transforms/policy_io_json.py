"""PolicyIO's file format: ``policy_io.json`` written (format 3) and read back (formats 1 to 3).

Apart from ``policy_io.py`` (what the transforms do) because reading is its own job: the format
versions and their readers, and the one line a malformed or unreadable file gets. The methods are
mixed into ``PolicyIO``; ``cls`` is PolicyIO (``__init__`` for format 3, ``compose`` for the older
top-level-key formats). This module never imports ``policy_io.py``: the mixin names its class ``_IO`` (a
type variable), so the import runs one way only (lint-imports' "no import circles" contract).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypeVar

from dit4dit_npu.transforms.feature_stats import FeatureStats
from dit4dit_npu.transforms.steps import PolicyIOError, steps_from_dicts
from dit4dit_npu.transforms.vector import VectorPipeline

# 3: the transforms as an ordered list of steps (``steps.py``), each writing itself. 1 (no crops)
# and 2 (camera_crops) kept each setting as a top-level key; both are still read.
FORMAT = "dit4dit_npu.policy_io/3"
FORMAT_1, FORMAT_2 = "dit4dit_npu.policy_io/1", "dit4dit_npu.policy_io/2"

_IO = TypeVar("_IO", bound="PolicyIOJson")  # the class it is mixed into: PolicyIO


class PolicyIOJson:
    """Serialization of ``PolicyIO`` (its fields: camera_keys, clip_offsets, chunk_length,
    source_sizes, stats, steps)."""

    camera_keys: list[str]
    clip_offsets: list[int]
    chunk_length: int
    source_sizes: dict[str, list[list[int]]]
    stats: dict[str, FeatureStats]
    steps: list[Any]

    @classmethod
    def compose(cls: type[_IO], **settings: Any) -> _IO:  # PolicyIO.compose: the steps from their settings
        raise NotImplementedError(f"{cls.__name__}.compose")

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "camera_keys": list(self.camera_keys),
            "clip_offsets": list(self.clip_offsets),
            "chunk_length": self.chunk_length,
            "source_sizes": self.source_sizes,
            "stats": {k: s.to_dict() for k, s in self.stats.items()},
            "steps": [s.to_dict() for s in self.steps],
        }

    @classmethod
    def from_dict(cls: type[_IO], d: dict[str, Any]) -> _IO:
        formats = (FORMAT, FORMAT_1, FORMAT_2)
        if not isinstance(d, dict) or d.get("format") not in formats:
            got = d.get("format") if isinstance(d, dict) else type(d).__name__
            raise PolicyIOError(f"not a PolicyIO (format {got!r}, expected one of {list(formats)})")
        if d["format"] == FORMAT_1 and "camera_crops" in d:
            raise PolicyIOError(f"malformed PolicyIO: camera_crops in a {FORMAT_1!r} file (crops are {FORMAT_2!r})")
        try:
            stats = {k: FeatureStats.from_dict(v) for k, v in d["stats"].items()}
            common = dict(camera_keys=list(d["camera_keys"]), clip_offsets=list(d["clip_offsets"]),
                          chunk_length=int(d["chunk_length"]), stats=stats, source_sizes=d.get("source_sizes") or {})
            if d["format"] == FORMAT:
                return cls(**common, steps=steps_from_dicts(d["steps"], stats))
            return cls.compose(  # formats 1 and 2: the same settings as top-level keys
                **common,
                image_size=tuple(d["image_size"]),
                view_layout=d["view_layout"],
                state=VectorPipeline.from_config(d["state"], stats["state"]),
                action=VectorPipeline.from_config(d["action"], stats["action"]),
                resize_method=d.get("resize_method", "swscale"),
                camera_crops=d.get("camera_crops") or {},
            )
        except PolicyIOError:
            raise
        except (KeyError, TypeError, ValueError) as e:
            raise PolicyIOError(f"malformed PolicyIO: {type(e).__name__}: {e}") from None

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1))

    @classmethod
    def load(cls: type[_IO], path: str | Path) -> _IO:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise PolicyIOError(f"{path}: unreadable ({e})") from None
        try:
            return cls.from_dict(data)
        except PolicyIOError as e:
            raise PolicyIOError(f"{path}: {e}") from None
