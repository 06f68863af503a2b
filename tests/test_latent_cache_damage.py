"""A damaged latent cache (garbage manifest, truncated or edited episode files, NaN latents, latents
scaled far outside the VAE's range, a changed source video) is named in one line, never read past
or trained on, and the encoder replaces what it finds damaged or changed (and only that)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from dit4dit_npu.config import load_config
from dit4dit_npu.data import DatasetError, build_training_data
from dit4dit_npu.data.cli import encode_latents_main as encode_main
from dit4dit_npu.data.latents import FORMAT, LatentCache
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


def edit_latents(path: Path, change, metadata: bool = True, forge_mtime: bool = False, forge_hash: bool = False) -> None:
    """Rewrite an episode file with ``change(tensors)`` applied: keeping its metadata (a careful
    edit) or not (``save_file`` as is), with its recorded mtime set back (``forge_mtime``: an edit
    the start-up check cannot see, only the first read's content check), and with its recorded
    latents hash rewritten to match (``forge_hash``: what only the per-sample checks behind it see)."""
    from dit4dit_npu.data.latent_key import latents_sha256

    with safe_open(str(path), "pt") as f:
        meta = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    change(tensors)
    if forge_hash:
        meta = {**meta, "latents_sha256": latents_sha256(tensors["latents"])}
    save_file(tensors, str(path), metadata=meta if metadata else None)
    if forge_mtime:
        os.utime(path, ns=(int(meta["mtime_ns"]),) * 2)


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
    (cache / "manifest.json").write_text(json.dumps({"format": FORMAT, "key": [1, 2]}))
    with pytest.raises(DatasetError, match="manifest.json has no valid key") as e:
        train_data(made, cache)
    one_line(e)


@pytest.mark.parametrize(
    "damage, message",
    [
        ("truncate", r"is unreadable \(.*\)"),
        ("drop clips", r"is damaged \(its file holds \['latents'\], expected \['clips', 'latents'\]\)"),
        ("short latents", r"is damaged \(latents \[3, 16, \d, 4, 12\] for 12 clips, expected \(12, C, T, h, w\)\)"),
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
    edit_latents(victim, lambda d: d["latents"][4, 0, 0, 2, 3].fill_(float("nan")), forge_mtime=True, forge_hash=True)
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
        lc.write_episode(0, episode, latents, clips, ds.datasets[0])
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


# -- the cache fingerprints content ---------------------------------------------------------------


def scale_x100(tensors: dict[str, torch.Tensor]) -> None:
    tensors["latents"].mul_(100)


def flip_a_latent_byte(path: Path) -> None:
    """One byte of the latents changed in place: same size, same header, another value."""
    data = bytearray(path.read_bytes())
    data[-100] ^= 0x40
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "edit, message",
    [
        ("x100 keeping its metadata", r"was changed since it was encoded \(its latents do not match their recorded sha256\)"),
        ("x100 by save_file", r"has no content fingerprint \(written by another tool, or edited\)"),
        ("one byte in place", r"was changed since it was encoded \(its latents do not match their recorded sha256\)"),
    ],
)
def test_edited_latents_are_refused_at_start_and_encoded_again(made, cache, capsys, edit, message):
    """The issue's case (one episode scaled x100 was trained on, and kept by the encoder)."""
    victim = episode_files(cache)[2]
    good = {k: v.clone() for k, v in load_file(victim).items()}
    if edit == "one byte in place":
        flip_a_latent_byte(victim)
    else:
        edit_latents(victim, scale_x100, metadata=edit == "x100 keeping its metadata")
    episode = int(victim.stem.split("_")[1])
    with pytest.raises(DatasetError, match=f"episode {episode} of .*robotwin_demo {message}; python -m dit4dit_npu") as e:
        train_data(made, cache)
    one_line(e)
    rc, out, err = encode(made, cache, capsys)
    assert rc == 0 and f"re-encoding {victim}: it " in err and "encoded 12 clips (1 episodes)" in out, (out, err)
    torch.testing.assert_close(load_file(victim)["latents"], good["latents"], rtol=1e-5, atol=1e-5)
    train_data(made, cache)  # whole again


def test_latents_far_outside_the_vae_range_are_refused_when_read_and_written(made, cache):
    """An edit no content check can see (metadata kept, mtime set back, the recorded hash rewritten):
    the per-read bound (the VAE's probe range x10, in the manifest) refuses the x100 episode; the
    writer refuses such latents from the VAE too."""
    victim = episode_files(cache)[1]
    edit_latents(victim, scale_x100, forge_mtime=True, forge_hash=True)
    ds = train_data(made, cache).train_dataset
    lc: LatentCache = ds.latents
    episode = int(victim.stem.split("_")[1])
    assert 0 < lc.bound < 100 * float(load_file(episode_files(cache)[0])["latents"].abs().max())
    with pytest.raises(DatasetError, match=rf"latent cache file {victim}: episode {episode} sample 0 has latents up to "
                                           r"[\d.]+, far outside the VAE's range \(\|x\| <= [\d.]+\)") as e:
        ds.latents.read(0, episode, 0)
    one_line(e)
    clips = ds.episode_clips(0, episode)
    with pytest.raises(DatasetError, match=rf"episode {episode} of .*: the VAE gave latents up to [\d.]+ for sample \d+ "
                                           r".*beyond its range") as e:
        lc.write_episode(0, episode, load_file(victim)["latents"], clips, ds.datasets[0])
    one_line(e)


def test_a_changed_source_video_is_found_for_its_episode_only(made, cache, tmp_path, capsys):
    """A video replaced by another of the same length (the dataset fingerprint, meta and file
    names, does not change): its episode is refused and encoded again, the others are kept. A
    video only touched (new mtime, same bytes) is accepted."""
    data = tmp_path / "data"
    shutil.copytree(made / "data", data)
    cfg_root = tmp_path
    videos = data / "robotwin_demo" / "videos"
    touched = sorted(videos.rglob("episode_000001.mp4"))[0]
    os.utime(touched, ns=(touched.stat().st_mtime_ns + 10**9,) * 2)
    victim = sorted(videos.rglob("episode_000003.mp4"))[0]
    shutil.copyfile(sorted(videos.rglob("episode_000004.mp4"))[0], victim)
    cfg = load_config(TINY, overrides(cfg_root, f"datasets.vla_data.latent_cache={cache}"))
    with pytest.raises(DatasetError, match=rf"episode 3 of .*robotwin_demo its source {victim} changed since it was "
                                           r"encoded \(.*\); python -m dit4dit_npu") as e:
        build_training_data(cfg, vae_identity=vae_identity(cfg))
    one_line(e)
    before = {p: p.stat().st_mtime_ns for p in episode_files(cache)}
    rc = encode_main(["--config", str(TINY), "--out", str(cache), *overrides(cfg_root)])
    out, err = capsys.readouterr()
    assert rc == 0 and "encoded 12 clips (1 episodes)" in out, (out, err)
    assert [p.name for p in episode_files(cache) if p.stat().st_mtime_ns != before[p]] == ["episode_000003.safetensors"]
    build_training_data(cfg, vae_identity=vae_identity(cfg))


# -- the cache checks content, not mtimes -------------------------------------------------------


def flip_middle_byte(path: Path) -> None:
    """One byte in the middle of a file changed, its size and mtime as they were: an edit that
    neither the size nor the mtime (nor the file's first and last MiB) shows."""
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


@pytest.mark.parametrize("edit", ["one latent x1.5", "every latent x100", "a source video's middle byte"])
def test_edits_with_the_mtime_put_back_are_caught_at_the_first_read(made, cache, tmp_path, edit):
    """The start-up check trusts an mtime that is the recorded one (one ``stat`` per file); these
    three edits put it back, pass it, and were trained on (or, x100, refused only per sample by
    the bound). The first read of the episode in the run hashes its latents and its source files
    whole: one line naming the file and what changed, before any of its samples is returned."""
    data = tmp_path / "data"
    shutil.copytree(made / "data", data, copy_function=shutil.copy2)  # times kept, as cp -a
    victim = episode_files(cache)[2]
    episode = int(victim.stem.split("_")[1])
    video = sorted((data / "robotwin_demo" / "videos").rglob(f"episode_{episode:06d}.mp4"))[0]
    if edit == "one latent x1.5":
        edit_latents(victim, lambda d: d["latents"][3, 1, 0, 1, 2].mul_(1.5), forge_mtime=True)
        what = (f"latent cache file {victim}: episode {episode}'s latents do not match the sha256 recorded when they "
                "were encoded (changed since, its mtime set back)")
    elif edit == "every latent x100":
        edit_latents(victim, scale_x100, forge_mtime=True)
        what = f"latent cache file {victim}: episode {episode}'s latents do not match the sha256 recorded"
    else:
        flip_middle_byte(video)
        what = (f"latent cache file {victim}: episode {episode}: its source {video} changed since it was encoded (same "
                "size and mtime, other content: its sha256 differs)")
    cfg = load_config(TINY, overrides(tmp_path, f"datasets.vla_data.latent_cache={cache}"))
    ds = build_training_data(cfg, vae_identity=vae_identity(cfg)).train_dataset  # the first look passes
    rows = [i for i in range(len(ds)) if ds.locate(i)[0] == 0 and ds.raw_sample(i, decode_views=False).episode == episode]
    with pytest.raises(DatasetError) as e:
        ds[rows[-1]]
    assert one_line(e).startswith(what) and one_line(e).endswith(
        "; delete it and re-encode with python -m dit4dit_npu.data.encode_latents --config FILE --out DIR"), one_line(e)
    other = next(i for i in range(len(ds)) if ds.raw_sample(i, decode_views=False).episode != episode)
    assert ds[other]["latents"].isfinite().all()  # the other episodes are read as before


def test_each_episode_and_source_is_verified_once_per_run_across_loader_workers(made, cache):
    """The flags live in shared memory: an episode a worker verified is not hashed again by the
    next epoch's workers (they start afresh each epoch), nor by the main process."""
    import torch.utils.data

    ds = train_data(made, cache).train_dataset
    lc: LatentCache = ds.latents
    assert not lc._verified.any() and lc._verified.is_shared()
    loader = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=2, collate_fn=lambda b: b)
    assert sum(len(b) for b in loader) == len(ds)
    assert lc._verified.all()  # set by the workers, seen here
    for i in range(len(ds)):
        ds[i]
    assert lc.verify_seconds == 0.0  # nothing left for this process to hash


@pytest.mark.slow
def test_a_full_disk_while_encoding_is_one_line_and_leaves_nothing_partial(made, tmp_path):
    """A real write failure from safetensors' own writer (it reports it as a SafetensorError, not
    an OSError): the encoder runs under a file-size rlimit smaller than one episode file (Python
    ignores SIGXFSZ, so the write fails with EFBIG exactly as on a full disk)."""
    import resource
    import subprocess
    import sys

    # half the smallest episode file of the same cache (the tiny config's clip length sets it);
    # the manifest and dataset.json are far smaller and fit
    limit = min(p.stat().st_size for p in episode_files(made / "cache")) // 2
    assert limit > 8_000

    def small_disk():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    out = tmp_path / "cache"
    r = subprocess.run(
        [sys.executable, "-m", "dit4dit_npu.data.encode_latents", "--config", str(TINY), "--out", str(out),
         *overrides(made)],
        capture_output=True, text=True, cwd=ROOT, timeout=300, preexec_fn=small_disk,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: no space left writing {out}/") and last.endswith(
        "nothing partial was left, the episodes written before are kept: run the encoder again once there is space"
    ), last
    assert not list(out.rglob("episode_*")) and not list(out.rglob(".*.tmp"))
