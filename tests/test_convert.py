"""Import of an original DiT4DiT run (``python -m dit4dit_npu.convert dit4dit``), without the
original: a checkpoint in its state-dict layout is built here from our own tiny modules by the
documented renaming (its frozen text encoder and VAE taken from the base model, as its trainer
saved them), with a config.yaml and dataset_statistics.json in its formats."""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from policy_fixtures import reseal
from safetensors.torch import load_file

from dit4dit_npu.config import load_config
from dit4dit_npu.convert import ConversionError, convert_dit4dit
from dit4dit_npu.weights import build_dit4dit, tiny_base_model

ROOT = Path(__file__).resolve().parents[1]
CHUNK, BLOCKS = 4, 2

# DiT4DiT's action-head keys (its module tree; notes: original_state_dict_keys.txt), per block {i}
DOCUMENTED_HEAD_KEYS = [
    "action_model.model.timestep_encoder.timestep_embedder.linear_{1,2}.{weight,bias}",
    "action_model.model.proj_out_{1,2}.{weight,bias}",
    "action_model.model.transformer_blocks.{i}.norm1.linear.{weight,bias}",
    "action_model.model.transformer_blocks.{i}.attn1.{to_q,to_k,to_v,to_out.0}.{weight,bias}",
    "action_model.model.transformer_blocks.{i}.ff.net.{0.proj,2}.{weight,bias}",
    "action_model.state_encoder.layer{1,2}.{weight,bias}",
    "action_model.action_encoder.layer{1,2,3}.{weight,bias}",
    "action_model.action_decoder.layer{1,2}.{weight,bias}",
    "action_model.position_embedding.weight",
]


def convert_cli(capfd, *argv: str) -> subprocess.CompletedProcess:
    """``python -m dit4dit_npu.convert ARGV`` in this process: the console script's function (its
    one-line errors and exit codes), what it printed."""
    from dit4dit_npu.convert.__main__ import main

    capfd.readouterr()
    code = main(list(argv))
    out, err = capfd.readouterr()
    return subprocess.CompletedProcess(list(argv), code, out, err)


def expand(template: str) -> list[str]:
    m = re.search(r"\{([^}]*)\}", template)
    if m is None:
        return [template]
    options = [str(i) for i in range(BLOCKS)] if m.group(1) == "i" else m.group(1).split(",")
    return [k for o in options for k in expand(template[: m.start()] + o + template[m.end() :])]


def original_name(ours: str) -> str:
    """Our parameter name -> DiT4DiT's (the documented mapping, written out independently of the
    converter's)."""
    rules = [
        (r"^backbone\.transformer\.", "backbone_interface.extractor.transformer."),
        (r"^action_model\.model\.timestep_embedder\.", "action_model.model.timestep_encoder.timestep_embedder."),
        (r"^action_model\.model\.blocks\.", "action_model.model.transformer_blocks."),
        (r"^action_model\.(state_encoder|action_decoder)\.0\.", r"action_model.\1.layer1."),
        (r"^action_model\.(state_encoder|action_decoder)\.2\.", r"action_model.\1.layer2."),
        (r"^action_model\.action_encoder\.W(\d)\.", r"action_model.action_encoder.layer\1."),
    ]
    for pattern, repl in rules:
        ours = re.sub(pattern, repl, ours)
    return ours


def original_config(**changes) -> dict:
    """DiT4DiT's config.yaml for this run (the keys its code read), LIBERO-style."""
    cfg = {
        "framework": {
            "name": "DiT4DiT",
            "cosmos25": {
                "base_model": "/data/Cosmos-Predict2.5-2B", "extract_layer": 1, "conditional_frame_timestep": 0.0001,
                "future_loss_type": "flow_matching", "future_num_inference_steps": 1, "torch_dtype": "float32",
                "training": "joint", "vl_hidden_dim": 32,
                "flow_matching": {"time_distribution": "uniform", "high_sigma_ratio": None, "high_sigma_min": None},
            },
            "action_model": {
                "action_model_type": "DiT-B", "hidden_size": 32, "add_pos_embed": True, "max_seq_len": 64,
                "action_dim": 8, "state_dim": 16, "future_action_window_size": CHUNK - 1, "action_horizon": CHUNK,
                "past_action_window_size": 0, "noise_beta_alpha": 1.5, "noise_beta_beta": 1.0, "noise_s": 0.999,
                "num_timestep_buckets": 1000, "num_inference_timesteps": 4,
                "diffusion_model_cfg": {"cross_attention_dim": 32, "dropout": 0.2, "final_dropout": True,
                                        "interleave_self_attention": True, "norm_type": "ada_norm",
                                        "num_layers": BLOCKS, "output_dim": 32, "positional_embeddings": None},
            },
        },
        "datasets": {"vla_data": {"action_video_freq_ratio": 1, "image_size": [224, 224],
                                  "video_delta_indices": [0, 1, 2, 3, 4]}},
        "trainer": {"repeated_diffusion_steps": 4, "freeze_modules": "backbone_interface.extractor.text_encoder,"
                    "backbone_interface.extractor.vae", "learning_rate": {"base": 1e-5, "backbone_interface": 1e-5,
                                                                           "action_model": 1e-4}},
    }
    for path, value in changes.items():
        node = cfg
        *parents, last = path.split(".")
        for p in parents:
            node = node[p]
        node[last] = value
    return cfg


def statistics(tag="franka", action_dim=7, state_dim=8) -> dict:
    rng = np.random.default_rng(0)

    def block(n):
        lo, hi = rng.uniform(-2, -0.5, n), rng.uniform(0.5, 2, n)
        return {"mean": ((lo + hi) / 2).tolist(), "std": ((hi - lo) / 4).tolist(), "max": hi.tolist(),
                "min": lo.tolist(), "q01": lo.tolist(), "q99": hi.tolist()}

    action = block(action_dim) | {"mask": [True] * (action_dim - 1) + [False]}
    return {tag: {"action": action, "state": block(state_dim), "num_transitions": 100, "num_trajectories": 3}}


def our_model(num_layers: int = BLOCKS):
    overrides = [
        "framework.cosmos25.base_model=tiny", "framework.cosmos25.tiny.num_layers=3",
        "framework.cosmos25.extract_layer=1", "framework.action_model.action_model_type=DiT-B",
        f"framework.action_model.diffusion_model_cfg.num_layers={num_layers}", "framework.action_model.hidden_size=32",
        "framework.action_model.diffusion_model_cfg.output_dim=32", "framework.action_model.max_seq_len=64",
        f"framework.action_model.chunk_length={CHUNK}", "trainer.mixed_precision='no'",
    ]
    cfg = load_config(None, overrides)
    from dit4dit_npu.batch import BatchSpec

    return cfg, build_dit4dit(cfg, BatchSpec(16, 8, CHUNK, 5, (32, 64)))


def frozen_tensors(base: Path) -> dict[str, torch.Tensor]:
    """The base model's text encoder and VAE under DiT4DiT's in-memory names."""
    out = {}
    for key, t in load_file(str(base / "text_encoder" / "model.safetensors")).items():
        mem = "model." + key if key.startswith("visual.") else (
            "model.language_model." + key[6:] if key.startswith("model.") else key)
        out[f"backbone_interface.extractor.text_encoder.{mem}"] = t
    for key, t in load_file(str(base / "vae" / "diffusion_pytorch_model.safetensors")).items():
        out[f"backbone_interface.extractor.vae.{key}"] = t
    return out


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """An original run folder: checkpoints/steps_7_pytorch_model.pt, config.yaml, statistics."""
    root = tmp_path_factory.mktemp("dit4dit_run")
    cfg, model = our_model()
    base = tiny_base_model(cfg.framework.cosmos25.tiny)
    g = torch.Generator().manual_seed(0)
    trained = {k: v + 0.01 * torch.randn(v.shape, generator=g) for k, v in model.trainable_state_dict().items()}
    ckpt = {original_name(k): v for k, v in trained.items()} | frozen_tensors(base)
    (root / "checkpoints").mkdir()
    torch.save(ckpt, root / "checkpoints" / "steps_7_pytorch_model.pt")
    (root / "config.yaml").write_text(yaml.safe_dump(original_config()))
    (root / "dataset_statistics.json").write_text(json.dumps(statistics()))
    return {"root": root, "base": base, "trained": trained, "ckpt": ckpt}


def test_checkpoint_layout_is_the_documented_one(run):
    head = {k for k in run["ckpt"] if k.startswith("action_model.")}
    assert head == {k for t in DOCUMENTED_HEAD_KEYS for k in expand(t)}


@pytest.mark.slow
def test_cli_converts_every_tensor_to_its_place(run, tmp_path, capfd):
    out = tmp_path / "policy"
    r = convert_cli(capfd, "dit4dit", "--checkpoint", str(run["root"] / "checkpoints" / "steps_7_pytorch_model.pt"),
                    "--config", str(run["root"] / "config.yaml"), "--base-model", str(run["base"]), "--out", str(out),
                    "--image-size", "32", "32")
    assert r.returncode == 0, r.stderr
    assert "framework.action_model.action_dim: 8 -> datasets.vla_data.max_action_dim" in r.stderr
    weights = load_file(str(out / "model.safetensors"))
    assert set(weights) == set(run["trained"])  # none left over, none missing
    for name, tensor in run["trained"].items():
        assert torch.equal(weights[name], tensor), name
    info = json.loads((out / "policy.json").read_text())
    c = info["model"]["framework"]["cosmos25"]
    assert info["format_version"] == 4 and info["step"] == 7 and c["base_model"] == str(run["base"].resolve())
    io = json.loads((out / "policy_io.json").read_text())
    steps = {s["step"]: s for s in io["steps"]}
    assert steps["resize_views"]["method"] == "torch_bilinear"
    assert steps["encode_state"]["vector"] == [{"kind": "sincos", "groups": [1] * 8}]
    assert [s["kind"] for s in steps["encode_action"]["vector"]] == ["normalize", "binarize", "clip", "pad"]
    assert (c["condition_latent"], c["round_timesteps"], c["feature_noise_seed"]) == ("sample", True, None)

    from dit4dit_npu import DiT4DiTPolicy

    policy = DiT4DiTPolicy.from_pretrained(out, device="cpu")
    rng = np.random.default_rng(0)
    obs = {key: rng.integers(0, 256, (32, 32, 3), dtype=np.uint8) for key in policy.camera_keys}
    actions = policy.predict_action(obs | {"state": np.zeros(8), "instruction": "pick up the cup"}, seed=0)
    assert actions.shape == (CHUNK, 7) and set(np.unique(actions[:, 6])) <= {0.0, 1.0}


def _convert(run, tmp_path, ckpt=None, config=None, stats=None, **kw):
    root = tmp_path / "in"
    root.mkdir(exist_ok=True)
    ckpt_path = run["root"] / "checkpoints" / "steps_7_pytorch_model.pt"
    if ckpt is not None:
        ckpt_path = root / "steps_7_pytorch_model.pt"
        torch.save(ckpt, ckpt_path)
    config_path = run["root"] / "config.yaml"
    if config is not None:
        config_path = root / "config.yaml"
        config_path.write_text(yaml.safe_dump(config))
    stats_path = run["root"] / "dataset_statistics.json"
    if stats is not None:
        stats_path = root / "dataset_statistics.json"
        stats_path.write_text(json.dumps(stats))
    out = tmp_path / "policy"
    with pytest.raises(ConversionError) as e:
        convert_dit4dit(ckpt_path, config_path, run["base"], out, stats=stats_path, conventions={"image_size": [32, 32]}, **kw)
    assert not out.exists()  # nothing written
    assert "\n" not in str(e.value)
    return str(e.value)


def test_checkpoint_of_another_architecture(run, tmp_path):
    msg = _convert(run, tmp_path, ckpt={"model.layers.0.weight": torch.zeros(2, 2)})
    assert "not a DiT4DiT checkpoint" in msg


def test_checkpoint_of_another_size(run, tmp_path):
    _, bigger = our_model(num_layers=BLOCKS + 2)
    ckpt = {original_name(k): v for k, v in bigger.trainable_state_dict().items()} | frozen_tensors(run["base"])
    msg = _convert(run, tmp_path, ckpt=ckpt)
    assert "does not fit the model of config.yaml" in msg and "transformer_blocks.2" in msg


def test_config_that_does_not_match_the_checkpoint(run, tmp_path):
    msg = _convert(run, tmp_path, config=original_config(**{"framework.action_model.state_dim": 32}))
    assert "action_model.state_encoder.layer1.weight has shape (32, 16), the config builds (32, 32)" in msg
    msg = _convert(run, tmp_path, config=original_config(**{"framework.action_model.action_horizon": 9}))
    assert "action_horizon (9) != future_action_window_size + 1 (4)" in msg


def test_statistics_of_another_embodiment(run, tmp_path):
    msg = _convert(run, tmp_path, stats=statistics("gr1", 29, 29))
    assert "the encoded state has 58 dims but the checkpoint's head takes 16 (statistics for another embodiment?)" in msg
    msg = _convert(run, tmp_path, stats=statistics("gr1", 7, 8), robot_type="libero_franka")
    assert "statistics of embodiment 'gr1', but robot type libero_franka is 'franka'" in msg


def test_base_model_whose_frozen_weights_differ(run, tmp_path):
    ckpt = dict(run["ckpt"])
    key = next(k for k in ckpt if k.startswith("backbone_interface.extractor.vae."))
    ckpt[key] = ckpt[key] + 1.0
    msg = _convert(run, tmp_path, ckpt=ckpt)
    assert "frozen vae weights differ from the base model" in msg and "--base-model" in msg


@pytest.mark.slow
def test_cli_bad_input_is_one_line(run, tmp_path, capfd):
    bad = tmp_path / "stats.json"
    bad.write_text(json.dumps(statistics("gr1", 29, 29)))
    r = convert_cli(capfd, "dit4dit", "--checkpoint", str(run["root"] / "checkpoints" / "steps_7_pytorch_model.pt"),
                    "--config", str(run["root"] / "config.yaml"), "--stats", str(bad), "--base-model", str(run["base"]),
                    "--out", str(tmp_path / "p"))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert not (tmp_path / "p").exists()


def test_diverged_checkpoint_is_refused(run, tmp_path):
    ckpt = dict(run["ckpt"])
    key = "action_model.action_decoder.layer2.weight"
    ckpt[key] = ckpt[key].clone()
    ckpt[key][0, 0] = float("nan")
    msg = _convert(run, tmp_path, ckpt=ckpt)  # nothing written: not a policy that loading would refuse
    assert f"trained tensor {key} has NaN or inf values" in msg


def test_out_that_is_a_file_or_a_damaged_base_model_is_one_line(run, tmp_path):
    import shutil

    ckpt = run["root"] / "checkpoints" / "steps_7_pytorch_model.pt"
    config, stats = run["root"] / "config.yaml", run["root"] / "dataset_statistics.json"
    a_file = tmp_path / "a_file"
    a_file.write_text("mine")
    with pytest.raises(ConversionError, match=f"--out {a_file} exists and is not a policy folder"):
        convert_dit4dit(ckpt, config, run["base"], a_file, stats=stats, conventions={"image_size": [32, 32]})
    assert a_file.read_text() == "mine"
    base = Path(shutil.copytree(run["base"], tmp_path / "base"))
    vae = base / "vae" / "diffusion_pytorch_model.safetensors"
    vae.write_bytes(vae.read_bytes()[:1000])
    out = tmp_path / "policy"
    with pytest.raises(ConversionError, match=r"base model .*: vae/diffusion_pytorch_model.safetensors is unreadable"):
        convert_dit4dit(ckpt, config, base, out, stats=stats, conventions={"image_size": [32, 32]})
    assert not out.exists()
    # a missing checkpoint is named as such, not as the statistics file its path would locate
    with pytest.raises(ConversionError, match="checkpoint not found: .*steps_9_pytorch_model.pt"):
        convert_dit4dit(tmp_path / "run/checkpoints/steps_9_pytorch_model.pt", config, run["base"], out)


def _stats_with(change) -> dict:
    stats = statistics()
    change(stats["franka"])
    return stats


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda s: s["state"].__setitem__("min", 5), r"state.min: expected a list of numbers, got 5"),
        (lambda s: s["state"].__setitem__("q99", ["a"] * 8), r"state.q99: expected a list of numbers"),
        (lambda s: s.__setitem__("action", [1, 2]), r"expected DiT4DiT's \{embodiment tag: \{action, state, ...\}\}"),
        (lambda s: s.__setitem__("num_transitions", "many"), r"num_transitions: expected a count, got 'many'"),
        (lambda s: s["action"].update(min=[1.0] * 7, max=[-1.0] * 7), r"action statistics have min > max in dims \[0, 1"),
    ],
)
def test_malformed_statistics_are_one_line(run, tmp_path, change, message):
    """Each was a TypeError / ValueError / AttributeError traceback (or, min > max, a policy whose
    actions come out mirrored)."""
    assert re.search(message, _convert(run, tmp_path, stats=_stats_with(change), robot_type="libero_franka"))


# -- the import verifies what it reads ------------------------------------------------------------


def test_constant_statistics_on_normalized_dims_are_refused_unless_allowed(run, tmp_path):
    """min == max on a dim the policy un-normalizes converted into a policy that always commands
    that joint to one value, silently."""
    def constant(dim):
        def change(s):
            s["action"]["max"][dim] = s["action"]["min"][dim]
        return change

    msg = _convert(run, tmp_path, stats=_stats_with(constant(2)), robot_type="libero_franka")
    assert msg.endswith(
        "dataset_statistics.json: action dims [2] have min == max among the dims the policy normalizes: it would always "
        "output (or see) their constant value (statistics of a single frame, or a joint that never moved?); pass "
        "--allow-constant-dims to convert anyway"
    ), msg
    stats = tmp_path / "in" / "dataset_statistics.json"
    ckpt = run["root"] / "checkpoints" / "steps_7_pytorch_model.pt"
    folder, notices = convert_dit4dit(ckpt, run["root"] / "config.yaml", run["base"], tmp_path / "allowed", stats=stats,
                                      conventions={"image_size": [32, 32]}, robot_type="libero_franka", allow_constant_dims=True)
    assert (folder / "policy.json").is_file()
    assert [n for n in notices if "min == max" in n] == [
        f"{stats}: action dims [2] have min == max among the dims the policy normalizes: it would always output (or "
        "see) their constant value (--allow-constant-dims)"
    ]
    stats.write_text(json.dumps(_stats_with(constant(6))))  # the gripper: not normalized (mask False), fine
    folder, notices = convert_dit4dit(ckpt, run["root"] / "config.yaml", run["base"], tmp_path / "gripper",
                                      stats=stats, conventions={"image_size": [32, 32]}, robot_type="libero_franka")
    assert not [n for n in notices if "min == max" in n]


def test_an_empty_config_or_out_under_a_file_is_one_line(run, tmp_path, capfd):
    ckpt = run["root"] / "checkpoints" / "steps_7_pytorch_model.pt"
    stats = run["root"] / "dataset_statistics.json"
    out = tmp_path / "policy"
    for text, message in (
        ("", "is empty: expected the config.yaml a DiT4DiT run wrote (framework, datasets, trainer)"),
        ("seed: 3\n", "has no 'framework' section: expected the config.yaml a DiT4DiT run wrote"),
        ("- 1\n- 2\n", "expected a mapping at the top level, got list"),
    ):
        config = tmp_path / "config.yaml"
        config.write_text(text)
        with pytest.raises(ConversionError) as e:
            convert_dit4dit(ckpt, config, run["base"], out, stats=stats, conventions={"image_size": [32, 32]})
        assert str(e.value).startswith(str(config)) and message in str(e.value), str(e.value)
        assert not out.exists()
    a_file = tmp_path / "a_file"
    a_file.write_text("mine")
    r = convert_cli(capfd, "dit4dit", "--checkpoint", str(ckpt), "--config", str(run["root"] / "config.yaml"),
                    "--stats", str(stats), "--base-model", str(run["base"]), "--out", str(a_file / "policy"))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == [f"error: --out {a_file}/policy: {a_file} is a file, not a folder"]
    assert a_file.read_text() == "mine"


# ---------------------------------------------------------------------------------------------
# Conventions as options, inferred choices as notices, what the checkpoint cannot tell
# ---------------------------------------------------------------------------------------------


def test_generic_tag_needs_the_robot_type(run, tmp_path):
    msg = _convert(run, tmp_path, stats=statistics("new_embodiment", 7, 8))
    assert "statistics tag 'new_embodiment' is generic and more than one robot type fits" in msg
    assert "custom" in msg and "--robot-type" in msg
    msg = _convert(run, tmp_path, stats=statistics("new_embodiment", 7, 8), robot_type="custom")
    assert "--robot-type custom: nothing says the --camera-keys and the --state-parts of this robot" in msg


def test_custom_conventions_convert_without_hand_edits(run, tmp_path):
    """One 8-d state key sin/cos, no reorder, min-max actions on the masked dims: flags, not edits
    of policy_io.json; every choice not given is a notice."""
    stats_path = tmp_path / "stats.json"
    stats_path.write_text(json.dumps(statistics("new_embodiment", 7, 8)))
    out = tmp_path / "policy"
    _, notices = convert_dit4dit(
        run["root"] / "checkpoints" / "steps_7_pytorch_model.pt", run["root"] / "config.yaml", run["base"], out,
        stats=stats_path, robot_type="custom",
        conventions={"camera_keys": ["cam_a", "cam_b"], "state_parts": [{"size": 8, "norm": "sincos"}],
                     "image_size": [32, 32]},
    )
    io = json.loads((out / "policy_io.json").read_text())
    state, action = (s["vector"] for s in io["steps"][3:])  # encode_state, encode_action
    assert state == [{"kind": "sincos"}] and io["camera_keys"] == ["cam_a", "cam_b"]
    assert [s["kind"] for s in action] == ["normalize", "clip", "pad"]
    assert action[0]["dims"] == list(range(6))  # the statistics mask
    text = "\n".join(notices)
    assert "datasets.vla_data.action_clip: all (DiT4DiT's clients clip every dim" in text
    assert "datasets.vla_data.action_parts: 6:min_max,1:none" in text
    assert "camera_keys" not in text and "image_size" not in text  # given, not inferred


def test_inferred_robot_type_and_image_size_are_notices(run, tmp_path):
    config = original_config()
    config["datasets"]["vla_data"]["image_size"] = [64, 64]
    out = tmp_path / "policy"
    root = tmp_path / "in"
    root.mkdir()
    (root / "config.yaml").write_text(yaml.safe_dump(config))
    _, notices = convert_dit4dit(run["root"] / "checkpoints" / "steps_7_pytorch_model.pt", root / "config.yaml",
                                 run["base"], out, stats=run["root"] / "dataset_statistics.json")
    text = "\n".join(notices)
    assert "robot type: libero_franka (from the statistics tag 'franka' and widths (8, 7))" in text
    assert "datasets.vla_data.image_size: 224,224 (DiT4DiT's dataset resized every view to 224 x 224; the config's " \
           "image_size [64, 64] was never read)" in text
    assert "action: its 7 encoded dims are zero-padded to the head's 8" in text


def test_head_count_the_checkpoint_cannot_tell(run, tmp_path):
    """4 x 16 and 2 x 32 give the same tensors: the config's count wins, a contradicting override
    is one line; a count the attention width disproves is one line."""
    heads = "framework.action_model.diffusion_model_cfg.num_attention_heads"
    dim = "framework.action_model.diffusion_model_cfg.attention_head_dim"
    stated = original_config(**{"framework.action_model.diffusion_model_cfg": {
        **original_config()["framework"]["action_model"]["diffusion_model_cfg"],
        "num_attention_heads": 12, "attention_head_dim": 64}})
    msg = _convert(run, tmp_path, config=stated, overrides=[f"{heads}=24", f"{dim}=32"])
    assert f"{heads}: the override says 24 but config.yaml states 12, which the run trained with" in msg
    wrong = copy.deepcopy(stated)
    wrong["framework"]["action_model"]["diffusion_model_cfg"]["num_attention_heads"] = 6
    msg = _convert(run, tmp_path, config=wrong)
    assert "6 heads x 64 = 384, but the checkpoint's attention is 768 wide" in msg
    unknown = original_config(**{"framework.action_model.action_model_type": "DiT-T"})
    msg = _convert(run, tmp_path, config=unknown)
    assert "'DiT-T' is not in DiT4DiT's size table (DiT-B, DiT-L)" in msg and f"pass {heads}=N" in msg


@pytest.mark.slow
def test_round_trip_original_ours_original(run, tmp_path):
    """original -> ours -> original: the same tensors and statistics; the exported run imports to
    the same policy again."""
    from dit4dit_npu.convert.__main__ import main

    first = tmp_path / "policy"
    convert_dit4dit(run["root"] / "checkpoints" / "steps_7_pytorch_model.pt", run["root"] / "config.yaml",
                    run["base"], first, conventions={"image_size": [32, 32]})
    back = tmp_path / "back"
    assert main(["to-dit4dit", str(first), "--out", str(back)]) == 0
    sd = torch.load(back / "checkpoints" / "steps_7_pytorch_model.pt", weights_only=True)
    assert set(sd) == set(run["ckpt"])
    for key, tensor in run["ckpt"].items():
        assert sd[key].dtype == tensor.dtype and torch.equal(sd[key], tensor), key
    assert json.loads((back / "dataset_statistics.json").read_text()) == statistics()
    # its constructor reads it (chunk = past + 1 + future); its from_pretrained failed without it
    assert yaml.safe_load((back / "config.yaml").read_text())["framework"]["action_model"]["past_action_window_size"] == 0
    again = tmp_path / "again"
    convert_dit4dit(back / "checkpoints" / "steps_7_pytorch_model.pt", back / "config.yaml", run["base"], again,
                    conventions={"image_size": [32, 32]})
    for name in ("policy_io.json",):
        assert json.loads((again / name).read_text()) == json.loads((first / name).read_text())
    assert json.loads((again / "policy.json").read_text())["model"] == json.loads((first / "policy.json").read_text())["model"]
    a, b = load_file(str(first / "model.safetensors")), load_file(str(again / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(ConversionError, match="exists and is not empty: choose a new"):
        from dit4dit_npu.convert.export import export_dit4dit

        export_dit4dit(first, back)


# ---------------------------------------------------------------------------------------------
# The export checks as much as the import
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def imported(run, tmp_path_factory) -> Path:
    """The original run imported once: a policy folder to export back."""
    out = tmp_path_factory.mktemp("imported") / "policy"
    convert_dit4dit(run["root"] / "checkpoints" / "steps_7_pytorch_model.pt", run["root"] / "config.yaml", run["base"],
                    out, conventions={"image_size": [32, 32]})
    return out


def test_export_refuses_non_finite_statistics_in_one_line(imported, tmp_path, capfd):
    """from_pretrained refuses them; the export wrote them into DiT4DiT's dataset_statistics.json."""
    policy = tmp_path / "policy"
    shutil.copytree(imported, policy)
    io = json.loads((policy / "policy_io.json").read_text())
    io["stats"]["action"]["q99"][2] = float("nan")
    (policy / "policy_io.json").write_text(json.dumps(io))
    r = convert_cli(capfd, "to-dit4dit", str(policy), "--out", str(tmp_path / "run"))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    [line] = r.stderr.strip().splitlines()  # the content check first: the file changed after export
    assert line.startswith(f"error: {policy}/policy_io.json has ") and line.endswith("(truncated or replaced after export)")
    reseal(policy)  # a folder written so (or of a format without hashes): the statistics themselves
    r = convert_cli(capfd, "to-dit4dit", str(policy), "--out", str(tmp_path / "run"))
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        f"error: {policy}/policy_io.json: action statistic 'q99' is NaN/inf in dims [2]; refusing a policy whose "
        "actions would be non-finite or wrong"]
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("one_pass, extra, message", [
    ({"enabled": True, "condition_head_on_noise_level": True}, {}, "conditioned on its features' noise level"),
    ({"enabled": True}, {"video_loss_future_frames": 1}, "1 + video_loss_future_frames latent frames"),
])
def test_export_refuses_a_head_dit4dit_cannot_feed(imported, tmp_path, capfd, one_pass, extra, message):
    """A one-pass head told its features' noise level, or trained on fewer latent frames than the
    clip's, would be fed other features by DiT4DiT's inference: refused, not exported."""
    policy = tmp_path / "policy"
    shutil.copytree(imported, policy)
    raw = json.loads((policy / "policy.json").read_text())
    raw["model"]["framework"]["cosmos25"].update({"one_pass": one_pass, **extra})
    (policy / "policy.json").write_text(json.dumps(raw))
    reseal(policy)
    r = convert_cli(capfd, "to-dit4dit", str(policy), "--out", str(tmp_path / "run"))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    [line] = r.stderr.strip().splitlines()
    assert line.startswith(f"error: {policy}: ") and message in line, line
    assert not (tmp_path / "run").exists()


def test_export_out_path_problems_are_one_line(imported, tmp_path, capfd):
    a_file = tmp_path / "a_file"
    a_file.write_text("mine")
    full = tmp_path / "full"
    full.mkdir()
    (full / "notes.txt").write_text("mine")
    for out, message in (
        (a_file / "run", f"--out {a_file}/run: {a_file} is a file, not a folder"),
        (a_file, f"--out {a_file} is a file: choose a new (or an empty) folder for the run"),
        (full, f"--out {full} exists and is not empty: choose a new (or an empty) folder for the run"),
    ):
        r = convert_cli(capfd, "to-dit4dit", str(imported), "--out", str(out))
        assert r.returncode == 2 and "Traceback" not in r.stderr
        assert r.stderr.strip().splitlines() == [f"error: {message}"]
    assert a_file.read_text() == "mine" and [p.name for p in full.iterdir()] == ["notes.txt"]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert convert_cli(capfd, "to-dit4dit", str(imported), "--out", str(empty)).returncode == 0
    assert (empty / "dataset_statistics.json").is_file()


@pytest.mark.parametrize("flags, message", [
    (["--state-parts", "8:foo"], "--state-parts '8:foo': encoding 'foo' is none of sincos, min_max, mean_std, q99, "
                                 "binary, none"),
    (["--action-parts", "6:sincos,1:none"], "--action-parts '6:sincos,1:none': encoding 'sincos' is none of min_max, "
                                            "mean_std, q99, binary, none"),
    (["--state-parts", "eight"], "--state-parts 'eight': expected SIZE:ENCODING[,SIZE:ENCODING...] with SIZE >= 1 and "
                                 "ENCODING one of sincos, min_max, mean_std, q99, binary, none, e.g. 6:min_max,1:binary"),
    (["--gripper-dims", "6,x"], "--gripper-dims '6,x': expected comma-separated dims (integers >= 0), e.g. 0,1,2, or '' "
                                "for none"),
    (["--state-parts", "8:sincos", "--state-order", "1,0,2,3,4,5,6,7"],
     "--state-order 1,0,2,3,4,5,6,7: datasets.vla_data.state_order: got [1, 0, 2, 3, 4, 5, 6, 7], expected null with "
     "sincos state parts (reordering is for same-width encodings)"),
])
def test_a_convention_flag_error_names_the_flag_and_the_valid_values(run, tmp_path, capfd, flags, message):
    stats = tmp_path / "stats.json"
    stats.write_text(json.dumps(statistics("new_embodiment", 7, 8)))
    r = convert_cli(capfd, "dit4dit", "--checkpoint", str(run["root"] / "checkpoints" / "steps_7_pytorch_model.pt"),
                    "--config", str(run["root"] / "config.yaml"), "--stats", str(stats), "--base-model", str(run["base"]),
                    "--out", str(tmp_path / "p"), "--robot-type", "custom", "--camera-keys", "cam_a", "cam_b",
                    "--image-size", "32", "32", *(["--state-parts", "8:sincos"] if "--state-parts" not in flags else []),
                    *flags)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == [f"error: {message}"]
    assert not (tmp_path / "p").exists()


def test_export_unknown_flags_print_its_usage_with_exit_2(imported, tmp_path, capfd):
    """A mistyped flag was taken for a config override ("takes no overrides", exit 1, no usage)."""
    out = tmp_path / "run"
    for extra in (["--frobnicate"], ["--tag=x", "trainer.seed=3"]):
        capfd.readouterr()
        with pytest.raises(SystemExit) as e:
            from dit4dit_npu.convert.__main__ import main

            main(["to-dit4dit", str(imported), "--out", str(out), *extra])
        err = capfd.readouterr().err
        assert e.value.code == 2 and err.startswith("usage: python -m dit4dit_npu.convert to-dit4dit "), err
        assert err.strip().splitlines()[-1].endswith(f"error: unrecognized arguments: {extra[-1]}"), err
    assert not out.exists()


def test_export_names_a_head_type_outside_dit4dits_presets(imported, tmp_path, capfd):
    """--action-model-type DiT-Q exported silently with exit 0: a name DiT4DiT's table lacks is said
    (an entry the user added loads; one they did not, fails in DiT4DiT's from_pretrained)."""
    r = convert_cli(capfd, "to-dit4dit", str(imported), "--out", str(tmp_path / "q"), "--action-model-type", "DiT-Q")
    assert r.returncode == 0, r.stderr
    assert ("  --action-model-type 'DiT-Q' is none of DiT4DiT's presets (DiT-B, DiT-L): the run loads only where its "
            "DiTConfig has an entry 'DiT-Q' with (width, heads, head dim) (768, 12, 64)") in r.stderr.splitlines(), r.stderr
    config = yaml.safe_load((tmp_path / "q" / "config.yaml").read_text())
    assert config["framework"]["action_model"]["action_model_type"] == "DiT-Q"
    r = convert_cli(capfd, "to-dit4dit", str(imported), "--out", str(tmp_path / "b"), "--action-model-type", "DiT-B")
    assert r.returncode == 0 and "presets" not in r.stderr, r.stderr


def test_export_of_a_damaged_unhashed_model_file_or_an_unmakeable_out_is_one_line(imported, tmp_path, capfd):
    """A format 3 folder is not hashed: a damaged model.safetensors reached safetensors' own
    SafetensorError traceback (reseal: the hashes match the damage, as no hashes would). An --out
    whose parent passes os.access but refuses folders (/proc, as root) was a FileNotFoundError."""
    policy = tmp_path / "policy"
    shutil.copytree(imported, policy)
    with open(policy / "model.safetensors", "r+b") as f:
        f.write(b"\xff" * 16)  # the header length: no safetensors reader can take it
    reseal(policy)
    r = convert_cli(capfd, "to-dit4dit", str(policy), "--out", str(tmp_path / "run"))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    [line] = r.stderr.strip().splitlines()
    assert line.startswith(f"error: {policy}/model.safetensors: not a readable safetensors file"), line
    assert not (tmp_path / "run").exists()
    if Path("/proc/self").is_dir():
        r = convert_cli(capfd, "to-dit4dit", str(imported), "--out", "/proc/dit4dit_run")
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        [line] = r.stderr.strip().splitlines()
        assert line.startswith("error: --out /proc/dit4dit_run"), line
