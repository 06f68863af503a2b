"""bench/_parity_original.py's run config is the ORIGINAL DiT4DiT's: it must size the original's head
with the original's own key, future_action_window_size (= chunk - 1). The chunk-length rename of
this project (framework.action_model.chunk_length) once reached that config too: the original
ignores the key and kept its yaml's window (7), so the robotwin preset (16 steps) failed inside
the original's predict_action on the noise's shape. The original checkout is external, so a
stand-in yaml with its key and default plays its config here."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench._parity_original import PRESETS, original_config


@pytest.fixture
def original_root(tmp_path: Path) -> Path:
    yaml = tmp_path / "DiT4DiT" / "config" / "libero" / "dit4dit_libero.yaml"
    yaml.parent.mkdir(parents=True)
    # the original's dit4dit_libero.yaml (commit 0362b34) states a window of 7
    yaml.write_text("framework:\n  action_model:\n    future_action_window_size: 7\n    action_dim: 7\n")
    return tmp_path


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_the_original_config_sets_the_presets_window_by_the_originals_key(original_root: Path, tmp_path: Path,
                                                                          preset: str) -> None:
    p = PRESETS[preset]
    cfg = original_config(original_root, tmp_path / "base", p, tmp_path / "runs" / "run")
    head = cfg.framework.action_model
    assert head.future_action_window_size == p["fws"]
    assert head.action_horizon == p["fws"] + 1
    # what the original writes to its config.yaml carries no key of ours: the import must convert its own
    assert "chunk_length" not in head


def test_the_presets_differ_from_the_yaml_default() -> None:
    """One preset at least must not be the yaml's 7, or the test above could not catch an unread key."""
    assert any(p["fws"] != 7 for p in PRESETS.values())
