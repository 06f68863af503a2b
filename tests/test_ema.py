"""trainer.ema (train/ema.py): the update maths by hand, and in real training runs (accelerate +
DeepSpeed ZeRO-2 on CPU, shared with test_train: tests/train_runs.py): exact resume with the
average, the exported policy holds the average, held-out evaluation scores it."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file
from torch import nn
from train_runs import EMA_ON, RUN, run_train, tiny_overrides

from dit4dit_npu.config import EMAConfig, load_config
from dit4dit_npu.train.ema import EMA, EMA_FILE, deal_out
from dit4dit_npu.train.metrics import read_metrics


def two_layer_model() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    model[1].bias.requires_grad_(False)  # frozen: never averaged
    return model


def set_weights(model: nn.Module, value: float) -> None:
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.fill_(value)


def test_update_maths_start_step_and_interval_by_hand():
    model = two_layer_model()
    ema = EMA(model, EMAConfig(decay=0.9, start_step=2, update_interval=2))
    assert sorted(ema.shadow) == ["0.bias", "0.weight", "1.weight"]
    expected = None
    for step, w in enumerate([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0], start=1):
        set_weights(model, w)
        ema.update(step)
        if step <= 2:
            expected = w  # a copy up to start_step
        elif step % 2 == 0:
            expected = 0.9 * expected + 0.1 * w  # steps 4 and 6 only
        for t in ema.shadow.values():
            assert torch.allclose(t, torch.full_like(t, expected), rtol=0, atol=1e-6), (step, t.flatten()[0], expected)
    # 2 -> 0.9*2 + 0.1*4 = 2.2 -> 0.9*2.2 + 0.1*6 = 2.58 (step 3 and 5 skipped, step 7 too)
    assert abs(expected - 2.58) < 1e-9
    assert ema.shadow["0.weight"].dtype == torch.float32


def test_swapped_puts_the_average_in_and_the_live_weights_back_exactly():
    model = two_layer_model()
    ema = EMA(model, EMAConfig(decay=0.5))
    set_weights(model, 1.0)
    ema.update(1)  # start_step 0: averaged from the first update: 0.5 * init + 0.5 * 1
    live = {k: v.clone() for k, v in model.state_dict().items()}
    with ema.swapped():
        for n, p in model.named_parameters():
            if p.requires_grad:
                assert torch.equal(p, ema.shadow[n])
        assert torch.equal(model[1].bias, live["1.bias"])  # frozen: left as it is
    assert all(torch.equal(v, live[k]) for k, v in model.state_dict().items())

    other = EMA(two_layer_model(), EMAConfig(decay=0.5))
    other.load_state_dict(ema.full_state_dict())
    assert all(torch.equal(other.shadow[k], ema.shadow[k]) for k in ema.shadow)
    with pytest.raises(KeyError, match=r"1 missing \(e.g. \['0.bias'\]\)"):
        other.load_state_dict({k: v for k, v in ema.full_state_dict().items() if k != "0.bias"})


def test_ranks_average_disjoint_shards_that_make_up_the_whole_average():
    sizes = {"a": 100, "b": 60, "c": 50, "d": 10, "e": 1}
    owner = deal_out(sizes, 2)
    assert owner == deal_out(dict(reversed(sizes.items())), 2)  # the same table on every rank
    assert sorted(sum(sizes[n] for n in sizes if owner[n] == r) for r in (0, 1)) == [110, 111]  # largest first, to the lighter rank
    assert set(deal_out(sizes, 8).values()) == {0, 1, 2, 3, 4}  # more ranks than tensors: some own none

    model, cfg = two_layer_model(), EMAConfig(decay=0.8, start_step=1)
    whole, shards = EMA(model, cfg), [EMA(model, cfg, rank=r, world=2) for r in (0, 1)]
    for step, w in enumerate([1.0, 3.0, -2.0], start=1):
        set_weights(model, w)
        for e in (whole, *shards):
            e.update(step)
    assert not set(shards[0].shadow) & set(shards[1].shadow)
    assert sorted([*shards[0].shadow, *shards[1].shadow]) == sorted(whole.shadow)
    for e in shards:
        assert all(torch.equal(t, whole.shadow[n]) for n, t in e.shadow.items())
    shards[1].load_state_dict(whole.full_state_dict())  # a checkpoint's whole average: keeps its shard
    assert all(torch.equal(t, whole.shadow[n]) for n, t in shards[1].shadow.items())


# -- real training runs -------------------------------------------------------------------------


def live_weights(ckpt) -> dict[str, torch.Tensor]:
    """The model weights DeepSpeed saved (the live ones, not the average)."""
    state = torch.load(ckpt / "state/pytorch_model/mp_rank_00_model_states.pt", weights_only=False)
    return state["module"]


@pytest.mark.slow
def test_resume_with_ema_is_exact_and_the_policy_holds_the_average(ema_workers_runs):
    """One process, prefetching loader workers: the run cut after step 2 and resumed."""
    a, b = ema_workers_runs.full / "checkpoints/step_000004", ema_workers_runs.cut / "checkpoints/step_000004"
    ema_a, ema_b = load_file(a / EMA_FILE), load_file(b / EMA_FILE)
    assert ema_a and sorted(ema_a) == sorted(ema_b)
    assert all(torch.equal(ema_a[k], ema_b[k]) for k in ema_a)  # bit-exact average after resume
    live_a, live_b = live_weights(a), live_weights(b)
    assert all(torch.equal(live_a[k], live_b[k]) for k in live_a)  # and live weights

    # The exported policy holds the average, not the live weights (which differ from it).
    policy = load_file(a / "policy/model.safetensors")
    assert sorted(policy) == sorted(ema_a)
    assert all(torch.equal(policy[k], ema_a[k]) for k in policy)
    assert any(not torch.equal(live_a[k], ema_a[k]) for k in ema_a)
    assert EMA_FILE in (a / "manifest.json").read_text()


@pytest.mark.slow
def test_held_out_eval_scores_the_average(ema_workers_runs):
    """val/action_mse logged at steps 2 and 4 is the held-out error of the exported (averaged)
    weights, recomputed here in-process with the trainer's own evaluation function."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    from dit4dit_npu.batch import Batch
    from dit4dit_npu.data import build_training_data
    from dit4dit_npu.policy.folder import load_policy_folder
    from dit4dit_npu.train.evaluate import held_out_action_mse

    run = ema_workers_runs.full
    logged = {r["step"]: r["val/action_mse"] for r in read_metrics(run / "metrics.jsonl") if "val/action_mse" in r}
    assert sorted(logged) == [2, 4]
    cfg = load_config(run / "config.yaml")  # the run's own resolved config
    data = build_training_data(cfg)
    acc = Accelerator(cpu=True)
    try:
        def score(model):  # the trainer draws its held-out noise with the run's seed, at every eval
            return held_out_action_mse(
                model, data.val_dataset, samples=cfg.trainer.eval_samples, batch_size=2, seed=cfg.seed,
                accelerator=acc, make_batch=lambda s: Batch.collate(s), targets=lambda b: (b.action, b.action_mask),
            )["val/action_mse"]

        for step in (2, 4):
            ckpt = run / f"checkpoints/step_{step:06d}"
            loaded = load_policy_folder(ckpt / "policy")
            loaded.model.set_prompt_cache(loaded.prompt_cache)
            averaged = score(loaded.model)
            loaded.model.load_trainable_state_dict(live_weights(ckpt), strict=False)
            live = score(loaded.model)
            assert logged[step] == pytest.approx(averaged, rel=1e-5), step
            assert abs(live - averaged) > 1e-6 * averaged, step  # the two weight sets score differently
    finally:
        AcceleratorState._reset_state(True)


@pytest.mark.slow
def test_ema_on_zero3_and_resume_without_ema_file_are_one_line_errors(tmp_path, demo_root):
    # a real process: the ZeRO-3 accelerator registers its config with transformers process-wide
    r = run_train(
        tiny_overrides(tmp_path, demo_root, **{**EMA_ON, "trainer.deepspeed_config": "configs/deepspeed/zero3.json"}),
        expect_ok=False,
    )
    assert r.returncode != 0
    assert "trainer.ema: not supported with ZeRO-3" in r.stderr + r.stdout
    assert "Traceback" not in r.stderr
    assert not (tmp_path / RUN).exists()  # refused before anything is written


@pytest.mark.slow
def test_two_process_zero2_ema_resumes_exactly(two_rank_runs):
    """Under DeepSpeed ZeRO-2 on 2 ranks each rank averages its shard of the weights; the shards
    meet in the saved average and the exported policy, and a resume continues them bit-exactly."""
    a, b = two_rank_runs.full / "checkpoints/step_000004", two_rank_runs.cut / "checkpoints/step_000004"
    assert len(list((a / "state").rglob("*optim_states.pt"))) == 2  # really partitioned over 2 ranks
    ema_a, ema_b, policy = load_file(a / EMA_FILE), load_file(b / EMA_FILE), load_file(a / "policy/model.safetensors")
    assert all(torch.equal(ema_a[k], ema_b[k]) and torch.equal(policy[k], ema_a[k]) for k in ema_a)
    live = live_weights(a)
    assert any(not torch.equal(live[k], ema_a[k]) for k in ema_a)
