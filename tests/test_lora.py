"""LoRA fine-tuning of the Cosmos transformer through peft (framework.cosmos25.lora), in real
training runs (accelerate + DeepSpeed ZeRO-2 on CPU) and with real peft on the exported files.

One LoRA run with EMA on, and the same run cut after step 2 and resumed, serve every test here
(the exported policy then holds the average: the in-memory comparisons swap it in)."""

from __future__ import annotations

import shutil

import pytest
import torch
from policy_fixtures import reseal
from safetensors.torch import load_file
from train_runs import EMA_ON, TINY, VIDEO_CLIPS, cut_at, run_training, tiny_overrides, train_here

from dit4dit_npu.config import ConfigError, load_config
from dit4dit_npu.models.lora import ADAPTER_MARK, PEFT_PREFIX
from dit4dit_npu.train.ema import EMA_FILE

LORA = {"framework.cosmos25.lora.rank": 4, "framework.cosmos25.lora.alpha": 8}


@pytest.fixture(scope="module")
def lora_runs(tmp_path_factory, demo_root):
    """A 4-step LoRA run with EMA, checkpoints at steps 2 and 4, and the same run cut after step 2
    and resumed (read-only use): (full, cut, config)."""
    root = tmp_path_factory.mktemp("lora")
    overrides = tiny_overrides(root / "full", demo_root, **LORA, **EMA_ON, **VIDEO_CLIPS)
    full = run_training(overrides)
    cut = cut_at(full, root / "cut", 2)
    run_training(tiny_overrides(root / "cut", demo_root, **{"trainer.resume": "auto", **LORA, **EMA_ON, **VIDEO_CLIPS}))
    return full, cut, load_config(TINY, overrides)


@pytest.fixture(scope="module")
def lora_run(lora_runs):
    full, _, cfg = lora_runs
    return full, cfg


def live_weights(ckpt) -> dict[str, torch.Tensor]:
    """The whole model as DeepSpeed saved it: what the trainer held in memory."""
    return torch.load(ckpt / "state/pytorch_model/mp_rank_00_model_states.pt", weights_only=False)["module"]


def fresh_model(cfg):
    from dit4dit_npu.transforms.policy_io import PolicyIO
    from dit4dit_npu.weights import build_dit4dit

    policy = cfg.run_dir / "checkpoints/step_000004/policy"
    return build_dit4dit(cfg, PolicyIO.load(policy / "policy_io.json").spec)


@pytest.mark.slow
def test_only_adapters_and_action_head_train(lora_run):
    run, cfg = lora_run
    step2, step4 = live_weights(run / "checkpoints/step_000002"), live_weights(run / "checkpoints/step_000004")
    base = fresh_model(cfg).state_dict()  # the frozen base as loaded from the base-model folder
    adapters = [k for k in step4 if ADAPTER_MARK in k]
    head = [k for k in step4 if k.startswith("action_model.")]
    frozen = [k for k in step4 if k not in adapters and k not in head]
    assert adapters and head and any(k.startswith("backbone.transformer.") for k in frozen)
    assert any(k.endswith("to_q.base_layer.weight") for k in frozen)
    for k in frozen:  # base transformer (and VAE) bit-identical after real optimizer steps
        assert torch.equal(step4[k], base[k]), k
    assert all(not torch.equal(step2[k], step4[k]) for k in adapters)  # every adapter tensor trains
    assert any(not torch.equal(step2[k], step4[k]) for k in head)
    assert all(float(step4[k].abs().sum()) > 0 for k in adapters if ".lora_B." in k)  # B starts at 0

    # The export holds the adapter (peft's layout) and the head, no base transformer weight.
    policy = run / "checkpoints/step_000004/policy"
    assert all(k.startswith("action_model.") for k in load_file(policy / "model.safetensors"))
    exported = load_file(policy / "adapter/adapter_model.safetensors")
    assert len(exported) == len(adapters) and all(k.startswith(PEFT_PREFIX) for k in exported)


def actions(model, cfg, seed: int = 3) -> torch.Tensor:
    from dit4dit_npu.batch import Batch
    from dit4dit_npu.data import build_training_data

    data = build_training_data(cfg)
    batch = Batch.collate([data.val_dataset[i] for i in (0, len(data.val_dataset) - 1)])
    with torch.no_grad():
        return model.eval().predict_action(batch, seed=seed)


@pytest.mark.slow
def test_train_export_load_gives_the_same_actions(lora_run):
    from dit4dit_npu.policy.folder import PolicyLoadError, load_policy_folder

    run, cfg = lora_run
    policy = run / "checkpoints/step_000004/policy"
    loaded = load_policy_folder(policy)
    in_memory = fresh_model(cfg)
    in_memory.load_state_dict(live_weights(run / "checkpoints/step_000004"), strict=True)
    # what the export saw: the average swapped in for the trained tensors (EMA on, test_ema)
    swapped = in_memory.load_state_dict(load_file(run / "checkpoints/step_000004" / EMA_FILE), strict=False)
    assert not swapped.unexpected_keys
    in_memory.set_prompt_cache(loaded.prompt_cache)
    loaded.model.set_prompt_cache(loaded.prompt_cache)
    want = actions(in_memory, cfg)
    assert torch.equal(actions(loaded.model, cfg), want)

    merged = load_policy_folder(policy, merge_lora=True)
    assert not any(ADAPTER_MARK in k for k, _ in merged.model.named_parameters())
    merged.model.set_prompt_cache(merged.prompt_cache)
    got = actions(merged.model, cfg)
    assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()

    # The adapter matters: the same head on the bare base transformer acts differently.
    bare = fresh_model(cfg)
    bare.load_trainable_state_dict(load_file(policy / "model.safetensors"))
    bare.set_prompt_cache(loaded.prompt_cache)
    assert (actions(bare, cfg) - want).abs().max() > 1e-4

    # Adapter files are part of the policy: a missing or foreign one is refused with one line.
    broken = run.parent / "broken_policy"
    shutil.copytree(policy, broken)
    (broken / "adapter/adapter_model.safetensors").unlink()
    with pytest.raises(PolicyLoadError, match=r"rank 4\) but \['adapter/adapter_model.safetensors'\] are missing"):
        load_policy_folder(broken)
    shutil.rmtree(broken)


@pytest.mark.slow
def test_peft_reads_the_exported_adapter(lora_run):
    """peft's own PeftModel.from_pretrained on a fresh tiny transformer: the same adapter weights,
    and peft's merge_and_unload equals ours."""
    from diffusers import CosmosTransformer3DModel
    from peft import PeftModel, get_peft_model_state_dict

    from dit4dit_npu.policy.folder import load_policy_folder
    from dit4dit_npu.weights import base_model_folder, load_weights

    run, cfg = lora_run
    policy = run / "checkpoints/step_000004/policy"
    transformer = load_weights(CosmosTransformer3DModel, base_model_folder(cfg, ("transformer",)), "transformer", torch.float32)
    peft_model = PeftModel.from_pretrained(transformer, str(policy / "adapter"))
    theirs = get_peft_model_state_dict(peft_model)
    exported = load_file(policy / "adapter/adapter_model.safetensors")  # both under peft's base_model.model. keys
    assert sorted(theirs) == sorted(exported) and all(torch.equal(theirs[k], exported[k]) for k in theirs)
    assert peft_model.peft_config["default"].r == 4 and peft_model.peft_config["default"].lora_alpha == 8

    peft_merged = peft_model.merge_and_unload().state_dict()
    ours = load_policy_folder(policy, merge_lora=True).model.backbone.transformer.state_dict()
    assert sorted(peft_merged) == sorted(ours)
    assert all(torch.allclose(peft_merged[k], ours[k], atol=1e-6) for k in ours)


@pytest.mark.slow
def test_resume_with_lora_and_ema_is_exact(lora_runs):
    full, cut, _ = lora_runs
    a, b = full / "checkpoints/step_000004", cut / "checkpoints/step_000004"
    for f in ("ema.safetensors", "policy/adapter/adapter_model.safetensors", "policy/model.safetensors"):
        x, y = load_file(a / f), load_file(b / f)
        assert x and sorted(x) == sorted(y) and all(torch.equal(x[k], y[k]) for k in x), f
    live_a, live_b = live_weights(a), live_weights(b)
    assert all(torch.equal(live_a[k], live_b[k]) for k in live_a)
    # EMA under LoRA covers the adapters and the head, nothing of the frozen base.
    ema = load_file(a / "ema.safetensors")
    assert {k.split(".")[0] for k in ema} == {"action_model", "backbone"}
    assert all(ADAPTER_MARK in k for k in ema if k.startswith("backbone."))
    # The exported adapter is the average (policy export happens with the EMA swapped in).
    adapter = load_file(a / "policy/adapter/adapter_model.safetensors")
    key = next(k for k in ema if ADAPTER_MARK in k)  # ...to_q.lora_A.default.weight
    peft_key = PEFT_PREFIX + key.removeprefix("backbone.transformer.").replace(".default", "")
    assert torch.equal(adapter[peft_key], ema[key]) and not torch.equal(live_a[key], ema[key])


def test_a_mistyped_target_module_is_one_clear_config_error(tmp_path, demo_root, capfd):
    from dit4dit_npu.weights.testing import small_spec

    cfg = load_config(TINY, ["framework.cosmos25.lora.rank=4", "framework.cosmos25.lora.target_modules=[to_q, to_kk]"])
    from dit4dit_npu.weights import build_dit4dit

    with pytest.raises(ConfigError, match=r"framework.cosmos25.lora.target_modules: .*\['to_kk'\] name no linear layer"):
        build_dit4dit(cfg, small_spec(cfg, state_width=14, action_width=14, frame_size=(32, 96)))
    r = train_here(
        tiny_overrides(tmp_path, demo_root, **LORA, **{"framework.cosmos25.lora.target_modules": "[to_q, to_kk]"}),
        capfd,
    )
    lines = [x for x in r.stderr.splitlines() if "to_kk" in x]
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert len(lines) == 1 and "framework.cosmos25.lora.target_modules" in lines[0], r.stderr[-2000:]
    with pytest.raises(ConfigError, match=r"framework.cosmos25.lora.rank: .*training 'action'"):
        load_config(TINY, ["framework.cosmos25.lora.rank=4", "framework.cosmos25.training=action"])


@pytest.mark.slow
def test_eval_cli_merges_on_request(lora_run, tmp_path, capsys):
    """`dit4dit_npu.eval --merge-lora` scores a LoRA policy merged; on a policy without an
    adapter the flag is one line, not a silent no-op."""
    import json

    from dit4dit_npu.eval import cli as eval_cli

    run, _ = lora_run
    policy = run / "checkpoints/step_000004/policy"
    args = ["--max-frames", "16", "--video-samples", "0", "--plot-episodes", "0"]
    assert eval_cli.main(["--policy", str(policy), "--out", str(tmp_path / "a"), *args]) == 0
    assert eval_cli.main(["--policy", str(policy), "--out", str(tmp_path / "b"), "--merge-lora", *args]) == 0
    adapter, merged = (json.loads((tmp_path / x / "metrics.json").read_text())["model"]["mse"] for x in "ab")
    assert merged == pytest.approx(adapter, rel=1e-4)

    plain = run.parent / "plain_policy"
    shutil.copytree(policy, plain)
    shutil.rmtree(plain / "adapter")
    info = json.loads((plain / "policy.json").read_text())
    info["model"]["framework"]["cosmos25"]["lora"]["rank"] = 0
    (plain / "policy.json").write_text(json.dumps(info))
    reseal(plain)
    capsys.readouterr()
    assert eval_cli.main(["--policy", str(plain), "--out", str(tmp_path / "c"), "--merge-lora", *args]) == 2
    assert capsys.readouterr().err.strip().endswith("this policy has no LoRA adapter to merge")
    shutil.rmtree(plain)


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "gradient-checkpointing"])
def test_adapters_get_gradients_base_does_not(checkpointing):
    """One real forward + backward: every adapter (in every block, also under diffusers'
    gradient checkpointing) gets a gradient, no base transformer weight does."""
    from dit4dit_npu.models.prompt_cache import PromptCache
    from dit4dit_npu.weights import build_dit4dit, build_prompt_encoder
    from dit4dit_npu.weights.testing import make_batch, small_spec

    cfg = load_config(TINY, [f"trainer.enable_gradient_checkpointing={str(checkpointing).lower()}",
                             *(f"{k}={v}" for k, v in LORA.items())])
    spec = small_spec(cfg, state_width=14, action_width=14, frame_size=(32, 96))
    model = build_dit4dit(cfg, spec).train()
    assert model.backbone.transformer.gradient_checkpointing is checkpointing
    batch = make_batch(spec)
    cache = PromptCache()
    cache.build(batch.instruction, build_prompt_encoder(cfg))
    model.set_prompt_cache(cache)
    out = model(batch)
    (out["action_loss"] + out["video_loss"]).backward()
    named = dict(model.backbone.transformer.named_parameters())
    adapters = {k: p for k, p in named.items() if ADAPTER_MARK in k}
    assert adapters and all(p.grad is not None for p in adapters.values())
    assert all(float(p.grad.abs().sum()) > 0 for k, p in adapters.items() if ".lora_B." in k)
    assert all(p.grad is None and not p.requires_grad for k, p in named.items() if k not in adapters)
