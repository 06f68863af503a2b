"""A damaged latent cache (garbage manifest, truncated or edited episode files, NaN latents) is named
in one line, never read past or trained on, and the encoder replaces damaged files it finds."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from dit4dit_npu.config import load_config
from dit4dit_npu.data import DatasetError, build_training_data
from dit4dit_npu.data.encode_latents import main as encode_main
from dit4dit_npu.data.latents import LatentCache
from dit4dit_npu.weights import vae_identity

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs/robotwin/dit4dit_robotwin_tiny.yaml"


def overrides(root: Path, *extra: str) -> list[str]:
    return [
        f"datasets.vla_data.data_root_dir={root / 'data'}",
        "datasets.vla_data.generate_demo_if_missing=false",
        f"run_root_dir={root / 'runs'}",
        *extra,
    ]


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> Path:
    """Demo data and a whole cache encoded in-process (one rank, no loader workers)."""
    from dit4dit_npu.data.demo import write_demo_dataset

    root = tmp_path_factory.mktemp("damage")
    write_demo_dataset(root / "data" / "robotwin_demo", num_episodes=5, episode_length=12)
    assert encode_main(["--config", str(TINY), "--out", str(root / "cache"), *overrides(root)]) == 0
    return root


@pytest.fixture
def cache(made, tmp_path) -> Path:
    """A fresh copy of the cache to damage."""
    return Path(shutil.copytree(made / "cache", tmp_path / "cache"))


def episode_files(cache: Path) -> list[Path]:
    return sorted(cache.glob("*/episode_*.safetensors"))


def train_data(made: Path, cache: Path):
    cfg = load_config(TINY, overrides(made, f"datasets.vla_data.latent_cache={cache}"))
    return build_training_data(cfg, vae_identity=vae_identity(cfg))


def one_line(e: pytest.ExceptionInfo) -> str:
    assert "\n" not in str(e.value)
    return str(e.value)


def encode(made: Path, cache: Path, capsys) -> tuple[int, str, str]:
    rc = encode_main(["--config", str(TINY), "--out", str(cache), *overrides(made)])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_a_manifest_whose_key_is_not_a_mapping_is_one_line(made, cache):
    (cache / "manifest.json").write_text(json.dumps({"format": "dit4dit_npu.latent_cache/1", "key": [1, 2]}))
    with pytest.raises(DatasetError, match="manifest.json has no valid key") as e:
        train_data(made, cache)
    one_line(e)


@pytest.mark.parametrize(
    "damage, message",
    [
        ("truncate", r"is unreadable \(.*\)"),
        ("drop clips", r"is damaged \(its file holds \['latents'\], expected \['clips', 'latents'\]\)"),
        ("short latents", r"is damaged \(latents \[3, 16, 2, 4, 12\] for 12 clips, expected \(12, C, T, h, w\)\)"),
    ],
)
def test_a_damaged_episode_file_is_named_at_start_and_encoded_again(made, cache, capsys, damage, message):
    victim = episode_files(cache)[1]
    good = {k: v.clone() for k, v in load_file(victim).items()}  # load_file may map the file
    if damage == "truncate":
        victim.write_bytes(victim.read_bytes()[:-64])
    elif damage == "drop clips":
        save_file({"latents": good["latents"]}, victim)
    else:  # every sample row must have its latents, or a read fails mid-training
        save_file({"latents": good["latents"][:3], "clips": good["clips"]}, victim)
    with pytest.raises(DatasetError, match=f"episode \\d+ of .*robotwin_demo {message}; python -m dit4dit_npu") as e:
        train_data(made, cache)
    one_line(e)
    rc, out, err = encode(made, cache, capsys)  # the encoder replaces it, it does not count it as cached
    assert rc == 0 and f"re-encoding {victim}: it " in err
    assert "encoded 12 clips (1 episodes)" in out, out
    again = load_file(victim)
    assert torch.equal(again["clips"], good["clips"])
    torch.testing.assert_close(again["latents"], good["latents"], rtol=1e-5, atol=1e-5)
    train_data(made, cache)  # whole again


def test_non_finite_latents_are_never_read(made, cache):
    victim = episode_files(cache)[0]
    d = load_file(victim)
    d["latents"][4, 0, 1, 2, 3] = float("nan")
    save_file(d, victim)
    ds = train_data(made, cache).train_dataset
    episode = int(victim.stem.split("_")[1])
    assert ds.latents.read(0, episode, 3).isfinite().all()
    with pytest.raises(DatasetError, match=f"latent cache file {victim}: sample 4 has non-finite latents") as e:
        ds.latents.read(0, episode, 4)
    one_line(e)


def test_non_finite_latents_are_never_written(made, cache):
    ds = train_data(made, cache).train_dataset
    lc: LatentCache = ds.latents
    episode = ds.episodes(0)[0]
    path = lc.episode_path(0, episode)
    before = path.read_bytes()
    clips = ds.episode_clips(0, episode)
    latents = torch.zeros(len(clips), 16, 2, 4, 12)
    latents[5, 1] = float("inf")
    with pytest.raises(DatasetError, match=r"the VAE gave non-finite latents for 1 of its 12 clips \(e.g. sample 5") as e:
        lc.write_episode(0, episode, latents, clips, ds.datasets[0].root)
    one_line(e)
    assert path.read_bytes() == before and not list(path.parent.glob(".*.tmp"))


def test_an_out_folder_that_cannot_be_made_is_one_line(made, tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    rc = encode_main(["--config", str(TINY), "--out", str(blocker / "cache"), *overrides(made)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.startswith(f"error: --out {blocker / 'cache'}: cannot create the cache folder"), err
    assert "\n" not in err and blocker.read_text() == "x"


def test_a_corrupt_video_read_in_a_loader_worker_is_one_line(tmp_path, capsys):
    """torch re-raises a worker's DatasetError with the worker's traceback in its message; the
    encoder prints the dataset's own line (and keeps the episodes finished before it)."""
    from dit4dit_npu.data.demo import write_demo_dataset

    write_demo_dataset(tmp_path / "data" / "robotwin_demo", num_episodes=5, episode_length=12)
    videos = sorted((tmp_path / "data" / "robotwin_demo" / "videos").rglob("episode_000003.mp4"))
    videos[0].write_bytes(videos[0].read_bytes()[:200])
    argv = ["--config", str(TINY), "--out", str(tmp_path / "cache"), "--batch-size", "12",
            *overrides(tmp_path, "datasets.vla_data.num_workers=1", "datasets.vla_data.val_fraction=0.0")]
    assert encode_main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"error: cannot open video {videos[0]} (truncated or corrupt mp4?)"), err
    assert sorted(p.name for p in (tmp_path / "cache").glob("*/episode_*")) == [
        f"episode_{e:06d}.safetensors" for e in range(3)
    ]
