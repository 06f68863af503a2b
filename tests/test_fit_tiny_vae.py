"""dit4dit-fit-tiny-vae --smoke on the shared demo set (3 steps, in-process), and the fitted weights
as every later run sees them: ``framework.cosmos25.tiny.vae_weights`` loads them into the tiny
model (its own cached folder, keyed by the file's content) and names them in the VAE identity a
latent cache is checked against; a file that is missing or of other sizes is one line."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest
import torch
from policy_fixtures import TINY_YAML
from safetensors.torch import load_file

from dit4dit_npu.config import ConfigError, load_config
from dit4dit_npu.train.ops_cli import fit_tiny_vae_main as main
from dit4dit_npu.weights import build_vae, tiny_base_model, vae_identity

LAST = re.compile(r"reconstruction MSE random (\d+\.\d+) -> fitted (\d+\.\d+) \(PSNR [\d.]+ -> [\d.]+ dB\)")


@pytest.fixture(scope="module")
def fitted(demo_root: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str], str]:
    out = tmp_path_factory.mktemp("fit") / "vae.safetensors"
    data = [f"datasets.vla_data.data_root_dir={demo_root}", "datasets.vla_data.generate_demo_if_missing=false"]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["--smoke", "--config", str(TINY_YAML), "--out", str(out), *data]) == 0
    return out, data, printed.getvalue()


def test_smoke_writes_weights_statistics_and_the_round_trip(fitted) -> None:
    out, _, printed = fitted
    m = LAST.fullmatch(printed.strip().splitlines()[-1])  # the last line: the error before and after
    assert m and all(float(x) > 0 for x in m.groups()), printed
    assert out.is_file() and out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    stats = out.with_suffix(".stats.txt").read_text().splitlines()
    assert [line.split(":")[0].strip() for line in stats] == ["vae_latents_mean", "vae_latents_std"]
    assert all(len(line.split("[")[1].split(",")) == 16 for line in stats)


def test_the_config_key_loads_the_fitted_weights(fitted) -> None:
    out, data, _ = fitted
    random_cfg = load_config(TINY_YAML, data)
    cfg = load_config(TINY_YAML, [*data, f"framework.cosmos25.tiny.vae_weights={out}"])
    weights = load_file(str(out))
    vae, random_vae = build_vae(cfg).state_dict(), build_vae(random_cfg).state_dict()
    assert set(vae) == set(weights) and all(torch.equal(vae[k], weights[k]) for k in weights)
    assert any(not torch.equal(random_vae[k], weights[k]) for k in weights)  # the fit changed it
    tiny = cfg.framework.cosmos25.tiny
    assert tiny_base_model(tiny) != tiny_base_model(random_cfg.framework.cosmos25.tiny)
    assert vae_identity(cfg) != vae_identity(random_cfg) and "fitted" in vae_identity(cfg)


def test_a_missing_or_mismatched_file_is_one_line(fitted, tmp_path: Path, capsys) -> None:
    out, data, _ = fitted
    cfg = load_config(TINY_YAML, [*data, f"framework.cosmos25.tiny.vae_weights={tmp_path / 'none.safetensors'}"])
    with pytest.raises(ConfigError, match="framework.cosmos25.tiny.vae_weights: cannot read"):
        build_vae(cfg)
    other = load_config(TINY_YAML, [*data, f"framework.cosmos25.tiny.vae_weights={out}",
                                    "framework.cosmos25.tiny.vae_base_dim=16"])
    with pytest.raises(ConfigError, match="does not fit this tiny VAE"):
        build_vae(other)

    assert main(["--smoke", "--config", str(TINY_YAML), "--out", str(tmp_path / "v.pt"), *data]) == 2
    assert "--out: expected a .safetensors file" in capsys.readouterr().err


def test_an_exported_policy_records_the_fitted_file_absolute(fitted, monkeypatch: pytest.MonkeyPatch) -> None:
    """Like a base-model folder: a policy loads from anywhere, not only from where training ran."""
    from dit4dit_npu.policy.manifest import manifest_of_run

    out, data, _ = fitted
    monkeypatch.chdir(out.parent)
    cfg = load_config(TINY_YAML, [*data, f"framework.cosmos25.tiny.vae_weights={out.name}"])
    manifest = manifest_of_run(cfg, {}, [], 2, None, None)
    assert manifest.framework.cosmos25.tiny.vae_weights == str(out.resolve())
    assert cfg.framework.cosmos25.tiny.vae_weights == out.name  # the run's config is left as it was


def test_bad_flags_are_one_line_before_anything_is_read_or_written(tmp_path: Path, capsys) -> None:
    # --steps 0 wrote the random VAE as fitted (rc 0); --lr nan and --frames 0 were tracebacks; an
    # --out or --png under a file failed after the fit (--png: with the weights already written)
    a_file = tmp_path / "a_file"
    a_file.write_text("kept")
    out = tmp_path / "v.safetensors"
    for flags, message in (
        (["--steps", "0"], "--steps: expected an int >= 1, got 0"),
        (["--frames", "0"], "--frames: expected an int >= 1, got 0"),
        (["--batch", "-1"], "--batch: expected an int >= 1, got -1"),
        (["--lr", "nan"], "--lr: expected a finite number > 0, got nan"),
        (["--lr", "0"], "--lr: expected a finite number > 0, got 0.0"),
        (["--png", str(a_file / "x.png")], f"--png {a_file}/x.png: {a_file} is a file, not a folder"),
    ):
        assert main(["--config", str(TINY_YAML), "--out", str(out), *flags]) == 2, flags
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0] and "Traceback" not in err[0], err
    bad_out = a_file / "v.safetensors"
    assert main(["--config", str(TINY_YAML), "--out", str(bad_out)]) == 2
    assert f"--out {bad_out}: {a_file} is a file, not a folder" in capsys.readouterr().err
    assert a_file.read_text() == "kept" and sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]
