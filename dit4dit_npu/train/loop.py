"""``train(cfg)``: the training algorithm, top to bottom.

Open the run folder (refusing before anything is written, choosing a whole checkpoint), build
the data (a resume refuses data that changed since its checkpoint) and the model (the prompt
cache is filled once, here, never per step; a fresh run starts from ``trainer.init_from``'s
weights when set), hand them to a ``Trainer`` (optimizer,
schedule, accelerate + DeepSpeed), resume if asked (falling back past a checkpoint whose weights
turn out non-finite once loaded), then step until ``max_train_steps``, logging, evaluating and
saving on their intervals (in steps, and in training seconds with trainer.save_every_s), until
``trainer.max_train_time_s`` training seconds if set (``budget.py``; with
``trainer.lr_schedule_clock=train_time`` the LR schedule ends there too). The verbs are in ``trainer.py``.
"""

from __future__ import annotations

from pathlib import Path

from dit4dit_npu import device
from dit4dit_npu.config import Config
from dit4dit_npu.config.objective import check_every_module_trains
from dit4dit_npu.sim.training_eval import check_sim_eval
from dit4dit_npu.train.checkpoint_manager import data_fingerprint, latest_checkpoint
from dit4dit_npu.train.distributed import (
    build_accelerator,
    building_outside_deepspeed,
    gather_from_ranks,
    share_from_main,
    stop_on_lost_rank,
    time_out_every_group,
)
from dit4dit_npu.train.errors import TrainingError
from dit4dit_npu.train.init_from import check_init_from, init_weights
from dit4dit_npu.train.optim import freeze_modules
from dit4dit_npu.train.resume import check_config, check_data
from dit4dit_npu.train.run_folder import RunFolder, discard_if_unused, fall_back, open_run, record_config
from dit4dit_npu.train.trainer import Trainer, check_ema_supported
from dit4dit_npu.weights.compile import check_compile, compile_backbone
from dit4dit_npu.weights.prompt_cache import prepare_prompt_cache

__all__ = ["TrainingError", "train"]


def train(cfg: Config) -> Path:
    """Run (or resume) training; returns the run folder."""
    import torch.distributed as dist

    device.apply_env_defaults()
    device.configure_host_allocator()  # glibc malloc thresholds, CPU hosts only (bench/malloc.py)
    # A caller's process group (a program that trains several runs in turn) is left as found:
    # DeepSpeed keeps handles to its groups, so a run that destroyed it would break the next one.
    callers_group = dist.is_available() and dist.is_initialized()
    accelerator = build_accelerator(cfg)
    try:
        return _train(cfg, accelerator)
    finally:
        # Also on errors: tear the process group down so gloo threads do not abort at exit.
        if not callers_group:
            accelerator.end_training()


def _train(cfg: Config, accelerator) -> Path:
    with stop_on_lost_rank(accelerator, cfg.trainer.collective_timeout_s, lambda: "starting up (run folder, data, "
                           "model)", lambda: latest_checkpoint(cfg.run_dir)):
        return _start(cfg, accelerator)


def _start(cfg: Config, accelerator) -> Path:
    check_every_module_trains(cfg)  # a module no loss reaches: refused before the run folder and the data
    check_ema_supported(cfg, accelerator)  # before the run folder is touched
    if cfg.trainer.compile:
        check_compile("trainer.compile")
    check_sim_eval(cfg.trainer.sim_eval)
    init = check_init_from(cfg)
    run = open_run(
        cfg,
        accelerator.is_main_process,
        accelerator.wait_for_everyone,
        lambda x: share_from_main(accelerator, x),
        gather_from_ranks(accelerator),
    )
    try:
        return _run(cfg, accelerator, run, init)
    except BaseException:
        discard_if_unused(run, accelerator.is_main_process)
        raise


def _run(cfg: Config, accelerator, run: RunFolder, init) -> Path:
    accelerator.print(
        f"run folder: {run.path.resolve()} | {device.describe()} | processes: {accelerator.num_processes}"
        f" | mixed precision: {accelerator.mixed_precision}"
    )
    device.seed_everything(cfg.seed + accelerator.process_index)
    data = build_data(cfg, accelerator)
    if run.resume_from is not None:  # changed data is refused before the model is built
        note = check_data(run.resume_from, data_fingerprint(data))
        if note:
            accelerator.print(note)
    record_config(cfg, run, accelerator.is_main_process)
    model, prompt_cache = build_model(cfg, accelerator, data, run.path)
    if init is not None and run.resume_from is None:  # before the optimizer, the EMA and DeepSpeed see it
        accelerator.print(init_weights(model, *init))
    elif init is not None:
        accelerator.print(f"trainer.init_from ignored: resuming from {run.resume_from}, which holds the weights")
    trainer = Trainer(cfg, accelerator, model, data, prompt_cache, run.path)
    t = cfg.trainer
    time_out_every_group(accelerator, t.collective_timeout_s)  # DeepSpeed's groups exist now
    # A rank that dies or stalls is named by the wait the others were in (trainer.activity).
    with stop_on_lost_rank(accelerator, t.collective_timeout_s, lambda: trainer.activity, trainer.checkpoints.latest):
        if run.resume_from is not None:
            resume(trainer, cfg, accelerator, data, run)
        else:
            trainer.start_fresh()
        with trainer.session():
            # trainer.max_train_time_s: the first step boundary past the budget is the last step
            while trainer.global_step < t.max_train_steps and not trainer.out_of_time:
                trainer.step()
                trainer.check_clock()
                if trainer.due(t.logging_frequency):
                    trainer.log()
                if trainer.due(t.eval_interval):
                    trainer.evaluate()
                if t.sim_eval.task is not None and trainer.due(t.sim_eval.interval):
                    trainer.sim_evaluate()
                if trainer.due(t.save_interval):
                    trainer.save()
        trainer.finish()
    return run.path


def resume(trainer: Trainer, cfg: Config, accelerator, data, run: RunFolder) -> None:
    """Load ``run.resume_from``; a checkpoint that loads but holds non-finite weights or EMA is
    set aside and the next whole one is loaded instead (checked against the config and data like
    the first)."""
    while (problem := trainer.resume(run.resume_from)) is not None:
        run = fall_back(
            cfg, run, run.resume_from, problem, accelerator.is_main_process, accelerator.wait_for_everyone,
            lambda x: share_from_main(accelerator, x),
        )
        check_config(run.resume_from, cfg)
        note = check_data(run.resume_from, data_fingerprint(data))
        if note:
            accelerator.print(note)


def build_data(cfg: Config, accelerator):
    """Datasets, split, PolicyIO (from the training statistics) and this rank's shard of the sampler."""
    from dit4dit_npu.data import build_training_data
    from dit4dit_npu.weights import vae_identity

    return build_training_data(
        cfg, rank=accelerator.process_index, world_size=accelerator.num_processes, barrier=accelerator.wait_for_everyone,
        vae_identity=vae_identity(cfg) if cfg.datasets.vla_data.latent_cache else None,
    )


def build_model(cfg: Config, accelerator, data, run_dir: Path):
    """The DiT4DiT model with its prompt cache set and its frozen modules frozen."""
    from dit4dit_npu.weights import build_dit4dit

    instructions = [task for ds in data.datasets for task in ds.meta.tasks.values()]
    with building_outside_deepspeed(accelerator):
        model = build_dit4dit(cfg, data.io.spec)
        prompt_cache = prepare_prompt_cache(cfg, accelerator, instructions, run_dir)
    model.set_prompt_cache(prompt_cache)
    freeze_modules(model, cfg.trainer.freeze_modules)
    if cfg.trainer.compile:  # after freezing (requires_grad is part of what compiles); lazy: the first steps pay
        n = compile_backbone(model, "trainer.compile")
        accelerator.print(f"trainer.compile: {n} transformer blocks compiled on first use (the first steps are slower)")
    return model, prompt_cache
