"""Non-finite weights in any file a run loads are named with the file when it is loaded, before
a step: the fitted tiny VAE (it loaded, and the run stopped with a divergence line blaming the
learning rate), a base-model folder's VAE, transformer or text encoder, an ``init_from`` policy's
weights. Real files, real loaders."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from train_runs import tiny_overrides, train_here

from dit4dit_npu.config import ConfigError
from dit4dit_npu.weights import build_prompt_encoder, build_vae, save_tiny_base_model
from dit4dit_npu.weights.build import build_backbone
from dit4dit_npu.weights.testing import small_config

ROOT = Path(__file__).resolve().parents[1]
FITTED = ROOT / "configs/aloha/tiny_vae_transfer_cube.safetensors"


def poison(file: Path) -> str:
    """One value of the file's first floating tensor set to NaN, its metadata kept; returns its name."""
    with safe_open(str(file), "pt") as f:
        meta = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    name = next(k for k, v in sorted(tensors.items()) if v.is_floating_point() and v.numel() > 1)
    tensors[name].view(-1)[1] = float("nan")
    save_file(tensors, str(file), metadata=meta)
    return name


def test_a_nan_fitted_tiny_vae_is_named_before_the_run_starts(tmp_path, demo_root, capfd):
    vae = tmp_path / "vae.safetensors"
    shutil.copyfile(FITTED, vae)
    name = poison(vae)
    key = "framework.cosmos25.tiny.vae_weights"
    r = train_here(tiny_overrides(tmp_path / "runs", demo_root, **{key: str(vae)}), capfd)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert r.stderr.strip().splitlines()[-1] == (
        f"config error: {key}: {vae}: tensor {name!r} has 1 NaN/inf value(s); refusing a VAE whose latents would be "
        "non-finite")
    assert not list((tmp_path / "runs").rglob("*"))  # no run folder
    cfg = small_config(f"{key}={vae}")
    with pytest.raises(ConfigError, match=f"{key}: {vae}: tensor {name!r} has 1 NaN/inf"):
        build_vae(cfg)


@pytest.mark.parametrize("component", ["vae", "transformer", "text_encoder"])
def test_a_nan_file_of_a_base_model_folder_is_named(tmp_path, component):
    base = save_tiny_base_model(small_config(), tmp_path / "Cosmos-Predict2.5-2B")
    [file] = sorted((base / component).glob("*.safetensors"))
    name = poison(file)
    cfg = small_config(f"framework.cosmos25.base_model={base}")
    build = {"vae": build_vae, "transformer": build_backbone, "text_encoder": build_prompt_encoder}[component]
    with pytest.raises(ConfigError) as e:
        build(cfg)
    assert str(e.value) == (f"framework.cosmos25.base_model: {file}: tensor {name!r} has 1 NaN/inf value(s); refusing "
                            "weights that make every step non-finite")


def test_a_nan_init_from_policy_is_named_before_a_step(tmp_path, demo_root):
    from policy_fixtures import build_tiny_setup, reseal, tiny_config

    from dit4dit_npu.train.init_from import check_init_from, init_weights
    from dit4dit_npu.weights import build_dit4dit

    setup = build_tiny_setup(tmp_path / "from", data_root=demo_root)
    weights = setup.policy_dir / "model.safetensors"
    tensors = load_file(str(weights))
    with safe_open(str(weights), "pt") as f:
        meta = f.metadata()
    name = sorted(k for k in tensors if k.startswith("action_model."))[0]
    tensors[name].view(-1)[0] = float("inf")
    save_file(tensors, str(weights), metadata=meta)
    reseal(setup.policy_dir)  # as its export wrote it (a run that diverged before it was exported)
    cfg = tiny_config(tmp_path / "to", f"trainer.init_from={setup.policy_dir}", data_root=demo_root)
    model = build_dit4dit(cfg, setup.data.io.spec)
    with pytest.raises(ConfigError) as e:
        init_weights(model, *check_init_from(cfg))
    assert str(e.value) == (f"trainer.init_from: {weights}: tensor {name!r} has 1 NaN/inf value(s); refusing a policy "
                            "whose actions would be non-finite")
