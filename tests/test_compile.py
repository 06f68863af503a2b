"""The opt-in torch.compile of the backbone's blocks (``dit4dit_npu/weights/compile.py``):
``trainer.compile`` for training, ``from_pretrained(compile=True)`` / ``--compile`` for inference.

The compiled model must compute what the eager one does (the same loss, gradients and actions up
to float rounding: inductor fuses elementwise ops, it changes no maths); a host that cannot
compile (Ascend NPU until a device run shows it works, CPU without a C++ compiler) is refused in
one line naming the key. The compiling tests are slow-tier: compiling the tiny blocks takes tens
of seconds on a loaded 2-core machine.
"""

from __future__ import annotations

import copy

import pytest
import torch
from train_runs import tiny_overrides, train_here

from dit4dit_npu import device as dev
from dit4dit_npu.console import error_line
from dit4dit_npu.train.metrics import read_metrics
from dit4dit_npu.weights.compile import check_compile, compile_backbone


def needs_compile() -> None:
    """Skip (with torch's own reason) where this host cannot compile; the refusal itself is tested below."""
    problem = dev.compile_problem()
    if problem is not None:
        pytest.skip(problem)


@pytest.fixture
def simulated_npu(monkeypatch):
    monkeypatch.setenv("DIT4DIT_DEVICE", "npu")
    dev.reset_cache()
    yield
    dev.reset_cache()


def test_compile_is_refused_on_npu_in_one_line_naming_the_key(simulated_npu):
    with pytest.raises(dev.DeviceError) as e:
        check_compile("trainer.compile")
    line = error_line(e.value)
    assert line.startswith("error: trainer.compile: torch.compile is not verified on Ascend NPU"), line
    assert "\n" not in str(e.value)


def test_from_pretrained_refuses_compile_on_npu_before_loading_anything(simulated_npu, tmp_path):
    from dit4dit_npu.policy import DiT4DiTPolicy

    with pytest.raises(dev.DeviceError, match=r"^compile / --compile: torch.compile is not verified on Ascend NPU"):
        DiT4DiTPolicy.from_pretrained(tmp_path / "no_such_policy", compile=True)  # not a file error: refused first


def test_compile_on_cpu_without_a_cxx_compiler_says_so(monkeypatch):
    monkeypatch.setenv("CXX", "/nonexistent/g++")
    assert "needs a C++ compiler" in dev.compile_problem()
    with pytest.raises(dev.DeviceError, match=r"^--compile: torch.compile on CPU needs a C\+\+ compiler"):
        check_compile("--compile")


def test_every_command_that_loads_a_policy_has_the_same_compile_flag(tmp_path):
    from dit4dit_npu.eval.cli import parse_args as eval_args
    from dit4dit_npu.serve.cli import parse_args as serve_args
    from dit4dit_npu.sim.cli import parse_eval_args as sim_args

    for parse, rest in ((serve_args, []), (eval_args, []), (sim_args, ["--out", str(tmp_path)])):
        assert parse(["--policy", "p", *rest]).compile is False  # off by default
        assert parse(["--policy", "p", "--compile", *rest]).compile is True


def test_sim_compile_applies_to_a_policy_folder_only():
    from dit4dit_npu.sim.errors import SimError
    from dit4dit_npu.sim.policies import make_policy

    for spec in ("hold", "ws://127.0.0.1:1"):
        with pytest.raises(SimError, match=r"^--compile: applies to a policy folder"):
            make_policy(spec, compile=True)


# ------------------------------------------------------------------------------ compiling (slow)


def small_model():
    from dit4dit_npu.models.prompt_cache import PromptCache
    from dit4dit_npu.weights import build_dit4dit, build_prompt_encoder
    from dit4dit_npu.weights.testing import INSTRUCTIONS, small_config, small_spec

    cfg = small_config()
    model = build_dit4dit(cfg, small_spec(cfg))
    cache = PromptCache()
    cache.build(INSTRUCTIONS, build_prompt_encoder(cfg))
    model.set_prompt_cache(cache)
    return model


def losses_and_grads(model, batch) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(1)  # the same noise draws for both models
    model.zero_grad(set_to_none=True)
    out = model(batch)
    loss = out["action_loss"] + out["video_loss"]
    loss.backward()
    grads = torch.cat([p.grad.flatten() for p in model.backbone.transformer.parameters() if p.grad is not None])
    return torch.stack([out["action_loss"], out["video_loss"]]).detach(), grads


@pytest.mark.slow
def test_compiled_blocks_give_the_eager_losses_gradients_and_actions():
    """Real diffusers Cosmos blocks, compiled one by one: training losses and the transformer's
    gradients, and predict_action at batch 1 and at two more sizes (the automatic-dynamic recompile),
    as eager; parameter names unchanged (checkpoints and policies do not see the compile)."""
    needs_compile()
    from dit4dit_npu.weights.testing import make_batch, small_config, small_spec

    spec = small_spec(small_config())
    eager = small_model()
    compiled = copy.deepcopy(eager)
    compiled.set_prompt_cache(eager.prompt_cache)
    assert compile_backbone(compiled, "test") == len(eager.backbone.transformer.transformer_blocks)
    assert list(compiled.state_dict()) == list(eager.state_dict())
    batch = make_batch(spec, batch_size=2)
    eager.train(), compiled.train()
    for _ in range(2):  # the second step runs the cached graphs
        want_loss, want_grad = losses_and_grads(eager, batch)
        got_loss, got_grad = losses_and_grads(compiled, batch)
        torch.testing.assert_close(got_loss, want_loss, rtol=1e-5, atol=1e-6)
        assert ((got_grad - want_grad).norm() / want_grad.norm()).item() < 1e-5
    for size in (1, 2, 3):
        obs = make_batch(spec, batch_size=size, seed=size, training=False)
        torch.testing.assert_close(compiled.predict_action(obs, seed=7), eager.predict_action(obs, seed=7),
                                   rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_policy_loaded_with_compile_predicts_the_eager_actions(tmp_path):
    """``from_pretrained(compile=True)``: the same robot-unit actions as the same policy loaded eager."""
    needs_compile()
    from policy_fixtures import build_tiny_setup, observation_from_sample

    from dit4dit_npu.policy import DiT4DiTPolicy

    setup = build_tiny_setup(tmp_path)
    eager = DiT4DiTPolicy.from_pretrained(setup.policy_dir)
    compiled = DiT4DiTPolicy.from_pretrained(setup.policy_dir, compile=True)
    obs = observation_from_sample(eager.camera_keys, setup.data.val_dataset.raw_sample(0))
    for seed in (0, 1):
        want = eager.predict_action(obs, seed=seed)
        got = compiled.predict_action(obs, seed=seed)
        assert got.shape == want.shape
        assert abs(got - want).max() <= 1e-4 * max(1.0, abs(want).max()), (got, want)


@pytest.mark.slow
def test_trainer_compile_trains_the_same_losses(tmp_path, demo_root, capfd):
    """A training run with ``trainer.compile=true`` (accelerate + DeepSpeed ZeRO-2, as every run)
    logs the losses of the same run eager, step by step."""
    needs_compile()
    rows = {}
    for name, flag in (("eager", "false"), ("compiled", "true")):
        overrides = tiny_overrides(tmp_path / name, demo_root, **{
            "trainer.compile": flag, "trainer.max_train_steps": 2, "trainer.save_interval": 2,
            "trainer.eval_interval": 2, "trainer.eval_samples": 0,  # no evaluation: its eval-mode graph is tested above
        })
        r = train_here(overrides, capfd)
        assert r.returncode == 0, r.stderr[-2000:]
        assert ("transformer blocks compiled on first use" in r.stdout) is (flag == "true")
        run_dir = tmp_path / name / "dit4dit_robotwin_tiny"
        rows[name] = [x for x in read_metrics(run_dir / "metrics.jsonl") if "total_loss" in x]
    assert [r["step"] for r in rows["compiled"]] == [r["step"] for r in rows["eager"]] == [1, 2]
    for a, b in zip(rows["eager"], rows["compiled"]):
        for key in ("action_loss", "video_loss", "total_loss"):
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), (key, a, b)
