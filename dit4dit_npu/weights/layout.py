"""The layout of a Cosmos-Predict2.5-2B diffusers folder, and the check that a folder has it.

``framework.cosmos25.base_model`` names such a folder (loaded with ``local_files_only``: nothing
is ever downloaded); the tiny cache (``tiny_cache.py``) writes folders laid out the same way.
"""

from __future__ import annotations

from pathlib import Path

from dit4dit_npu.errors import ConfigError

# component folder -> file that must exist in it
COMPONENTS = {
    "transformer": "config.json",
    "vae": "config.json",
    "scheduler": "scheduler_config.json",
    "text_encoder": "config.json",
    "tokenizer": "tokenizer_config.json",
}
BACKBONE_PARTS = ("transformer", "vae", "scheduler")
TEXT_PARTS = ("text_encoder", "tokenizer")


def check_base_model(path: str | Path, parts: tuple[str, ...] = tuple(COMPONENTS)) -> Path:
    """The folder and every needed component exist, else one error naming what is missing."""
    p = Path(path).expanduser()
    expect = ", ".join(f"{c}/" for c in COMPONENTS)
    if not p.is_dir():
        raise ConfigError(
            f"framework.cosmos25.base_model: {str(path)!r} is neither 'tiny' nor a folder (expected a local "
            f"Cosmos-Predict2.5-2B diffusers folder with {expect}; nothing is downloaded)"
        )
    missing = [f"{c}/{f}" for c in parts if not (p / c / (f := COMPONENTS[c])).is_file()]
    if missing:
        raise ConfigError(
            f"framework.cosmos25.base_model: {p} is missing {', '.join(missing)} "
            f"(a Cosmos-Predict2.5-2B diffusers folder has {expect})"
        )
    return p
