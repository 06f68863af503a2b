"""Policy API: export -> from_pretrained fidelity, robot units, batching, instructions, errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from policy_fixtures import build_tiny_setup, observation_from_sample, reseal, shared_tiny_setup

from dit4dit_npu.batch import Batch
from dit4dit_npu.eval.research import predict_video
from dit4dit_npu.policy import DiT4DiTPolicy, PolicyInputError, PolicyLoadError, export_policy
from dit4dit_npu.transforms.images import resize_rgb


@pytest.fixture(scope="module")
def setup():
    return shared_tiny_setup()


@pytest.fixture(scope="module")
def policy(setup) -> DiT4DiTPolicy:
    return DiT4DiTPolicy.from_pretrained(setup.policy_dir)


def _obs(policy: DiT4DiTPolicy, setup, i: int = 0) -> dict:
    return observation_from_sample(policy.camera_keys, setup.data.val_dataset.raw_sample(i))


def _train_a_little(model, data, steps: int = 2) -> None:
    """Real optimizer steps on real batches, so the exported weights differ from a fresh build."""
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.05)
    model.train()
    for s in range(steps):
        batch = Batch.collate([data.train_dataset[i] for i in range(4 * s, 4 * s + 4)])
        losses = model(batch)
        (losses["action_loss"] + losses["video_loss"]).backward()
        opt.step()
        opt.zero_grad()


@pytest.mark.slow  # over 4 s of one core: the full tier (the fast tier keeps to 3 minutes)
def test_export_load_gives_the_in_training_models_actions(tmp_path: Path) -> None:
    s = build_tiny_setup(tmp_path)
    _train_a_little(s.model, s.data)
    out = export_policy(tmp_path / "p2", s.model, s.cfg, s.data.io, s.cache, s.data.split, s.data.dataset_paths, 2)
    policy = DiT4DiTPolicy.from_pretrained(out)

    # Only trainable weights are stored, bit-identical; the frozen VAE is rebuilt from its reference.
    from safetensors.torch import load_file

    stored = load_file(str(out / "model.safetensors"))
    trained = s.model.trainable_state_dict()
    assert stored.keys() == trained.keys() and not any(k.startswith("backbone.vae") for k in stored)
    for k, v in trained.items():
        assert torch.equal(stored[k], v.cpu()), k

    ds = s.data.val_dataset
    batch = Batch.collate([ds[i] for i in (0, 5)]).first_frame()  # the training data path
    expected = s.data.io.decode_actions(s.model.predict_action(batch, seed=11))
    samples = [ds.raw_sample(i) for i in (0, 5)]
    obs = {k: np.stack([observation_from_sample(policy.camera_keys, x)[k] for x in samples]) for k in policy.camera_keys}
    obs.update(state=np.stack([x.state for x in samples]), instruction=[x.instruction for x in samples])
    got = policy.predict_action(obs, seed=11)
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
    assert json.loads((out / "policy.json").read_text())["step"] == 2


def _base_without_transformer_weights(setup, root: Path) -> Path:
    """A copy of the tiny base folder whose transformer has its config but no weights (and no text
    encoder: the policy's prompt cache is then taken as it is, as for any base folder without one)."""
    from dit4dit_npu.weights.tiny_cache import tiny_base_model

    base = root / "base"
    shutil.copytree(tiny_base_model(setup.cfg.framework.cosmos25.tiny), base)
    shutil.rmtree(base / "text_encoder")
    weights = [f for f in (base / "transformer").iterdir() if f.name != "config.json"]
    assert weights and all(f.suffix in (".safetensors", ".json") for f in weights), weights
    for f in weights:
        f.unlink()
    return base


@pytest.mark.slow  # over 4 s of one core: the full tier (the fast tier keeps to 3 minutes)
def test_a_policy_that_holds_its_transformer_never_reads_the_base_folders_copy(tmp_path: Path) -> None:
    """A joint run's policy file holds the trained transformer: the load takes it from there and
    does not read the base folder's (at full size 8.3 GB of fp32 read, then overwritten). Proof:
    the same policy loads against a base folder whose transformer has no weight file at all, with
    the trained weights bit for bit (in fp32, and cast to a bf16 backbone)."""
    s = build_tiny_setup(tmp_path)
    _train_a_little(s.model, s.data)
    out = export_policy(tmp_path / "p2", s.model, s.cfg, s.data.io, s.cache, s.data.split, s.data.dataset_paths, 2)
    base = _base_without_transformer_weights(s, tmp_path)
    trained = {k: v for k, v in s.model.trainable_state_dict().items() if k.startswith("backbone.transformer.")}
    assert trained
    for dtype in (None, torch.bfloat16):
        policy = DiT4DiTPolicy.from_pretrained(out, base_model=str(base), backbone_dtype=dtype)
        got = dict(policy.model.named_parameters())
        for k, v in trained.items():
            assert torch.equal(got[k], v.to(dtype or torch.float32)), (dtype, k)
        assert not any(t.is_meta for t in [*policy.model.parameters(), *policy.model.buffers()])
    # where the transformer was frozen (training: action) its weights are the base folder's alone
    a = build_tiny_setup(tmp_path / "action", "framework.cosmos25.training=action")
    with pytest.raises(PolicyLoadError, match="transformer"):
        DiT4DiTPolicy.from_pretrained(a.policy_dir, base_model=str(base))


@pytest.mark.slow  # over 4 s of one core: the full tier (the fast tier keeps to 3 minutes)
@pytest.mark.parametrize("frozen", ["framework.cosmos25.training=action", "framework.cosmos25.lora.rank=4"])
def test_a_frozen_transformer_policy_with_transformer_weights_in_its_file_is_one_line(
    setup, tmp_path: Path, frozen: str
) -> None:
    """A policy whose transformer was frozen (training: action, or LoRA's base) takes it from the
    base folder; transformer weights in its file (files of two runs mixed) are refused in one line,
    not built into a half-loaded model."""
    from safetensors.torch import load_file, save_file

    s = build_tiny_setup(tmp_path, frozen)
    stray = {k: v for k, v in setup.model.trainable_state_dict().items() if k.startswith("backbone.transformer.")}
    weights = s.policy_dir / "model.safetensors"
    meta = {"step": "0"}
    save_file({**load_file(str(weights)), **{k: v.contiguous() for k, v in stray.items()}}, str(weights), metadata=meta)
    reseal(s.policy_dir)
    with pytest.raises(PolicyLoadError, match="unexpected") as e:
        DiT4DiTPolicy.from_pretrained(s.policy_dir)
    assert "\n" not in str(e.value)


def test_outputs_are_robot_units_and_unnormalization_inverts_training(setup, policy: DiT4DiTPolicy) -> None:
    io = setup.data.io
    assert policy.io == io  # the checkpoint's transforms and statistics are the training ones, exactly
    sample = setup.data.val_dataset.raw_sample(3)
    raw = sample.actions.astype(np.float64)
    # Training targets are io.normalize_actions(raw); the policy applies io.decode_actions.
    np.testing.assert_allclose(io.decode_actions(io.normalize_actions(raw)), raw, rtol=0, atol=1e-6)
    np.testing.assert_allclose(setup.data.val_dataset[3]["action"].numpy(), io.normalize_actions(raw), atol=1e-6)
    obs = _obs(policy, setup, 3)
    actions = policy.predict_action(obs, seed=0)
    batch, _ = policy.io.encode_observation(obs)
    normalized = policy.model.predict_action(batch, seed=0)[0].numpy().astype(np.float64)
    np.testing.assert_allclose(io.normalize_actions(actions.astype(np.float64)), normalized, atol=1e-5)
    assert actions.shape == (policy.chunk_length, policy.action_dim) and actions.dtype == np.float32


def test_observation_matches_the_training_sample(setup, policy: DiT4DiTPolicy) -> None:
    ds = setup.data.val_dataset
    batch, batched = policy.io.encode_observation(observation_from_sample(policy.camera_keys, ds.raw_sample(7)))
    sample = ds[7]
    assert not batched
    assert torch.equal(batch.frames[0, 0], sample["frames"][0])
    torch.testing.assert_close(batch.state[0], sample["state"])
    assert batch.instruction == [sample["instruction"]]


def test_deterministic_under_seed(setup, policy: DiT4DiTPolicy) -> None:
    obs = _obs(policy, setup)
    a, b = policy.predict_action(obs, seed=5), policy.predict_action(obs, seed=5)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, policy.predict_action(obs, seed=6))
    v1, v2 = predict_video(policy, obs, steps=2, seed=1), predict_video(policy, obs, steps=2, seed=1)
    np.testing.assert_array_equal(v1, v2)
    h, w = policy.image_size
    assert v1.dtype == np.uint8 and v1.ndim == 4 and v1.shape[1:] == (h, w * len(policy.camera_keys), 3)


def test_batch_and_single_agree(setup, policy: DiT4DiTPolicy) -> None:
    singles = [_obs(policy, setup, i) for i in (0, 9, 20)]
    batched = {k: np.stack([o[k] for o in singles]) for k in (*policy.camera_keys, "state")}
    batched["instruction"] = [o["instruction"] for o in singles]
    out = policy.predict_action(batched, seed=4)
    assert out.shape == (3, policy.chunk_length, policy.action_dim)
    # A seeded batch uses the same noise for every row, so each row is its single call's answer
    # (a request's result does not depend on its batch-mates).
    for i, o in enumerate(singles):
        np.testing.assert_allclose(out[i], policy.predict_action(o, seed=4), rtol=1e-5, atol=1e-5)
    # Every row's inputs are exactly what a single call would build.
    batch, is_batched = policy.io.encode_observation(batched)
    assert is_batched
    for i, o in enumerate(singles):
        one, _ = policy.io.encode_observation(o)
        assert torch.equal(batch.frames[i], one.frames[0]) and torch.equal(batch.state[i], one.state[0])
    v = predict_video(policy, batched, steps=1, seed=0)
    assert v.shape[0] == 3 and v.ndim == 5
    for i, o in enumerate(singles):  # imagined videos too: a row is its single call's answer
        single = predict_video(policy, o, steps=1, seed=0)
        assert np.abs(v[i].astype(int) - single.astype(int)).max() <= 1  # uint8 rounding


def test_an_empty_batch_is_a_policy_input_error(policy: DiT4DiTPolicy) -> None:
    """It was a plain TypeError ('got []'), which a server counts as its own failure, not the caller's."""
    for empty in ([], (), iter([])):
        with pytest.raises(PolicyInputError) as e:
            policy.predict_batch(empty)
        assert str(e.value) == "predict_batch: expected one or more requests (ParsedRequests or ModelSpaceRequests), got none"


def test_bf16_backbone_stays_close_to_fp32(setup, policy: DiT4DiTPolicy) -> None:
    fast = DiT4DiTPolicy.from_pretrained(setup.policy_dir, backbone_dtype=torch.bfloat16)
    assert fast.model.backbone.dtype == torch.bfloat16 and fast.model.action_model.dtype == torch.float32
    obs = _obs(policy, setup, 1)
    ref = policy.predict_action(obs, seed=0)
    np.testing.assert_allclose(fast.predict_action(obs, seed=0), ref, atol=0.05 * float(np.abs(ref).max()))
    with pytest.raises(ValueError, match="backbone_dtype"):
        DiT4DiTPolicy.from_pretrained(setup.policy_dir, backbone_dtype=torch.int8)


def test_images_are_resized_like_training(setup, policy: DiT4DiTPolicy) -> None:
    obs = _obs(policy, setup, 2)
    h, w = policy.image_size
    big = {**obs, **{k: np.repeat(np.repeat(obs[k], 2, 0), 2, 1) for k in policy.camera_keys}}  # same aspect
    small = {**obs, **{k: resize_rgb(big[k], (h, w)) for k in policy.camera_keys}}
    np.testing.assert_array_equal(policy.predict_action(big, seed=0), policy.predict_action(small, seed=0))


def test_unseen_instruction_is_encoded_once_and_cached(setup) -> None:
    policy = DiT4DiTPolicy.from_pretrained(setup.policy_dir)
    n = len(policy.prompt_cache)
    obs = {**_obs(policy, setup), "instruction": "wave at the camera"}
    a = policy.predict_action(obs, seed=0)
    calls = policy._instructions.text_encoder.num_calls
    b = policy.predict_action(obs, seed=0)
    assert len(policy.prompt_cache) == n + 1 and policy._instructions.text_encoder.num_calls == calls == 1
    np.testing.assert_array_equal(a, b)
    assert "wave at the camera" in policy.metadata["instructions"]


def test_one_policy_object_with_two_predictions_and_settings_given_at_construction(setup) -> None:
    """One class, no mixins sharing its state; two public predictions (the users' and the
    server's); the instruction cap is a setting given when it is built, read-only after."""
    assert DiT4DiTPolicy.__mro__ == (DiT4DiTPolicy, object)
    public = {n for n in dir(DiT4DiTPolicy) if not n.startswith("_")}
    assert {n for n in public if n.startswith("predict")} == {"predict_action", "predict_batch"}
    assert not {"predict_video", "reconstruct_video", "observation_features", "predict_normalized"} & public
    capped = DiT4DiTPolicy.from_pretrained(setup.policy_dir, max_added_instructions=1)
    assert capped.max_added_instructions == 1 and capped.describe().instructions
    with pytest.raises(AttributeError):
        capped.max_added_instructions = 8  # a server never sets it
    for bad in (-1, 1.5, True, "8"):
        with pytest.raises(PolicyInputError, match=r"max_added_instructions: expected an int >= 0 or None, got "):
            DiT4DiTPolicy.from_pretrained(setup.policy_dir, max_added_instructions=bad)


def test_unseen_instruction_without_text_encoder_is_a_clear_error(setup, tmp_path: Path) -> None:
    from dit4dit_npu.weights import save_tiny_base_model

    base = save_tiny_base_model(setup.cfg, tmp_path / "cosmos")
    shutil.rmtree(base / "text_encoder")  # a deployment folder with transformer + VAE only
    policy = DiT4DiTPolicy.from_pretrained(setup.policy_dir, base_model=str(base))
    obs = _obs(policy, setup)
    assert policy.predict_action(obs, seed=0).shape == (policy.chunk_length, policy.action_dim)  # cached: fine
    with pytest.raises(PolicyInputError, match="not in the policy's prompt cache and no text encoder"):
        policy.predict_action({**obs, "instruction": "wave at the camera"})


def test_bad_observations(setup, policy: DiT4DiTPolicy) -> None:
    obs = _obs(policy, setup)
    cam = policy.camera_keys[0]
    two = {k: np.stack([obs[k]] * 2) for k in (*policy.camera_keys, "state")}
    cases = [
        ({k: v for k, v in obs.items() if k != cam}, rf"missing \['{cam}'\]"),
        ({**obs, "observation.images.extra": obs[cam]}, "unexpected"),
        ({**obs, cam: obs[cam].astype(np.float32)}, "uint8"),
        ({**obs, cam: obs[cam][..., 0]}, r"expected \(H, W, 3\)"),
        ({**obs, "state": np.zeros(policy.state_dim + 1)}, "state: expected shape"),
        ({k: v for k, v in obs.items() if k != "instruction"}, r"missing \['instruction'\]"),
        ({**obs, "instruction": "  "}, "empty string"),
        ({**two, cam: obs[cam], "instruction": "x"}, "same batch size"),
        ({**two, "instruction": ["a", "b", "c"]}, "3 strings for a batch of 2"),
        ({**two, "state": obs["state"], "instruction": "x"}, r"state: expected shape \(2, "),
        ("not a dict", "must be a dict"),
    ]
    for bad, match in cases:
        with pytest.raises(PolicyInputError, match=match):
            policy.predict_action(bad)


def test_policy_folder_errors(setup, tmp_path: Path) -> None:
    with pytest.raises(PolicyLoadError, match="not found"):
        DiT4DiTPolicy.from_pretrained(tmp_path / "nope")
    with pytest.raises(PolicyLoadError, match="not a policy folder"):
        DiT4DiTPolicy.from_pretrained(tmp_path)
    broken = tmp_path / "broken"
    shutil.copytree(setup.policy_dir, broken)
    (broken / "policy_io.json").unlink()
    with pytest.raises(PolicyLoadError, match=r"incomplete, missing \['policy_io.json'\]"):
        DiT4DiTPolicy.from_pretrained(broken)
    future = tmp_path / "future"
    shutil.copytree(setup.policy_dir, future)
    info = json.loads((future / "policy.json").read_text())
    (future / "policy.json").write_text(json.dumps({**info, "format_version": 99}))
    with pytest.raises(PolicyLoadError, match="format_version 99 is not supported"):
        DiT4DiTPolicy.from_pretrained(future)
    with pytest.raises(PolicyLoadError, match="cannot build the model described in .*policy.json: .*no_cosmos_here"):
        DiT4DiTPolicy.from_pretrained(setup.policy_dir, base_model=str(tmp_path / "no_cosmos_here"))
    other = tmp_path / "other_config"
    shutil.copytree(setup.policy_dir, other)
    info = json.loads((other / "policy.json").read_text())
    info["model"]["framework"]["action_model"]["hidden_size"] = 64
    (other / "policy.json").write_text(json.dumps(info))
    reseal(other)
    with pytest.raises(PolicyLoadError, match="model.safetensors does not fit the model of .*policy.json"):
        DiT4DiTPolicy.from_pretrained(other)


def test_checkpoint_and_run_folders_are_accepted(setup, tmp_path: Path) -> None:
    ckpt = tmp_path / "runs" / "r" / "checkpoints" / "step_000010"
    shutil.copytree(setup.policy_dir, ckpt / "policy")
    assert DiT4DiTPolicy.from_pretrained(ckpt).path == ckpt / "policy"
    assert DiT4DiTPolicy.from_pretrained(tmp_path / "runs" / "r").path == ckpt / "policy"


def test_export_replaces_atomically(setup, tmp_path: Path) -> None:
    s = setup
    out = tmp_path / "policy"
    for step in (1, 2):
        export_policy(out, s.model, s.cfg, s.data.io, s.cache, s.data.split, s.data.dataset_paths, step)
    assert json.loads((out / "policy.json").read_text())["step"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["policy"]  # no temp or old folders left
    info = json.loads((out / "policy.json").read_text())
    path = str(Path(s.data.dataset_paths[0]).resolve())
    split = s.data.split[str(s.data.dataset_paths[0])]
    assert info["data"]["datasets"] == {path: {"held_out_episodes": split["val"], "train_episodes": split["train"]}}
    assert info["model"]["framework"]["cosmos25"]["base_model"] == "tiny"


def test_top_level_import() -> None:
    import dit4dit_npu

    assert dit4dit_npu.DiT4DiTPolicy is DiT4DiTPolicy
