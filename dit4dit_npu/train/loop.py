"""The training loop: accelerate + DeepSpeed, exact resume, atomic checkpoints, policy export.

One step (per micro-batch): prompt embeddings come from the cache built before the loop, the
model returns `action_loss` and `video_loss`, the total is `action_loss + λ·video_loss`
(trainer.loss_scale.future_video), accelerate/DeepSpeed does the
backward, clipping and the optimizer step, and we step the LR schedule. Host syncs (`.item()`)
happen only on logging, eval and save steps.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import torch
from accelerate.utils import DistributedType

from dit4dit_npu import device
from dit4dit_npu.config import Config, ConfigError, save_config
from dit4dit_npu.train import checkpoint as ckpt_io
from dit4dit_npu.train.distributed import build_accelerator, building_outside_deepspeed, gathered_parameters
from dit4dit_npu.train.metrics import MetricsLogger, plot_losses
from dit4dit_npu.train.optim import build_optimizer, build_scheduler, freeze_modules, group_lrs

# A real Cosmos prompt embedding is 512 x 100352 bf16 values (~100 MB per instruction). Up to this
# size the whole cache lives on the device, saving a host->device copy of B embeddings per step;
# beyond it (many instructions) it stays in host memory.
PROMPT_CACHE_ON_DEVICE_BYTES = 2 * 2**30


class TrainingError(RuntimeError):
    """A training problem with a one-line, user-facing message."""


def user_errors() -> tuple[type[Exception], ...]:
    """Errors that mean bad input (config, data, base model, launch), not a bug."""
    from dit4dit_npu.batch import BatchError
    from dit4dit_npu.data import DatasetError
    from dit4dit_npu.models import FrameInputError, PromptCacheError

    return (ConfigError, TrainingError, device.DeviceError, DatasetError, BatchError, FrameInputError, PromptCacheError)


def _prepare_run_dir(cfg: Config, is_main: bool) -> Path:
    run_dir = cfg.run_dir
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / f".write-probe-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise ConfigError(f"run_root_dir/run_id: cannot write to {run_dir} ({e.strerror})") from None
    if cfg.trainer.resume is None and ckpt_io.list_checkpoints(run_dir):
        raise ConfigError(
            f"{run_dir} already has checkpoints: continue it with trainer.resume=auto, "
            "or choose another run_id (nothing was overwritten)"
        )
    return run_dir


def _truncate_metrics(path: Path, step: int) -> None:
    """On resume, drop rows the interrupted run logged after its last checkpoint."""
    if path.is_file():
        rows = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line)["step"] <= step]
        path.write_text("".join(r + "\n" for r in rows))


def _to_device(batch: dict, dev: torch.device) -> dict:
    return {k: (v.to(dev, non_blocking=True) if torch.is_tensor(v) else v) for k, v in batch.items()}


def _unwrap(model):
    return getattr(model, "module", model)


def _build_prompt_cache(cfg: Config, accelerator, instructions: list[str], run_dir: Path):
    """Rank 0 encodes every instruction once; the others load its file. The encoder is then freed."""
    from dit4dit_npu.models import PromptCache, build_prompt_encoder
    from dit4dit_npu.policy.prompts import load_prompt_cache, save_prompt_cache

    path = Path(cfg.framework.cosmos25.prompt_cache or run_dir / "prompt_cache.safetensors")
    if accelerator.is_main_process:
        cache = load_prompt_cache(path) if path.is_file() else PromptCache()
        missing = [t for t in dict.fromkeys(instructions) if t not in cache]
        if missing:
            encoder = build_prompt_encoder(cfg)
            cache.build(missing, encoder)
            del encoder  # the 7B text model never stays resident during training
        save_prompt_cache(cache, path)
    accelerator.wait_for_everyone()
    return load_prompt_cache(path), path


def _evaluate(model, data, cfg: Config, accelerator, step: int) -> dict[str, float]:
    """Held-out action MSE (normalized units) in eval mode (the original used train mode, SPEC A6)."""
    ds = data.val_dataset
    if ds is None or len(ds) == 0 or cfg.trainer.eval_samples <= 0 or _unwrap(model).action_model is None:
        return {}  # video-only training has no action head to score
    from dit4dit_npu.data import collate

    n = min(cfg.trainer.eval_samples, len(ds))
    # Evenly spaced held-out samples, sharded over ranks; the same set at every eval.
    indices = [round(i * (len(ds) - 1) / max(n - 1, 1)) for i in range(n)][accelerator.process_index :: accelerator.num_processes]
    inner = _unwrap(model)
    was_training = inner.training
    inner.eval()
    sq, cnt = torch.zeros((), device=accelerator.device), torch.zeros((), device=accelerator.device)
    bs = cfg.datasets.vla_data.per_device_batch_size
    with torch.no_grad():
        for i in range(0, len(indices), bs):
            batch = _to_device(collate([ds[j] for j in indices[i : i + bs]]), accelerator.device)
            pred = inner.predict_action(batch, seed=cfg.seed + step)
            mask = batch["action_mask"].float()
            sq += ((pred.float() - batch["action"].float()) ** 2 * mask).sum()
            cnt += mask.sum()
    inner.train(was_training)
    sq, cnt = accelerator.reduce(sq, "sum"), accelerator.reduce(cnt, "sum")
    return {"val/action_mse": float(sq / cnt.clamp(min=1))}


def train(cfg: Config) -> Path:
    """Run (or resume) training; returns the run folder."""
    device.apply_env_defaults()
    accelerator = build_accelerator(cfg)
    try:
        return _train(cfg, accelerator)
    finally:
        # Also on errors: tear the process group down so gloo threads do not abort at exit.
        accelerator.end_training()


def _train(cfg: Config, accelerator) -> Path:
    is_main = accelerator.is_main_process
    run_dir = _prepare_run_dir(cfg, is_main)
    resume_from = ckpt_io.find_resume(cfg)
    if resume_from is not None:
        ckpt_io.check_fingerprint(resume_from, cfg)
    if is_main:  # only once the run is known to be valid: a refused run overwrites nothing
        save_config(cfg, run_dir / "config.yaml")
    device.seed_everything(cfg.seed + accelerator.process_index)

    from dit4dit_npu.batch import BatchSpec
    from dit4dit_npu.data import build_training_data
    from dit4dit_npu.models import build_dit4dit

    data = build_training_data(
        cfg, rank=accelerator.process_index, world_size=accelerator.num_processes, barrier=accelerator.wait_for_everyone
    )
    instructions = [task for ds in data.datasets for task in ds.meta.tasks.values()]
    data_cfg = cfg.datasets.vla_data
    # Provisional until PolicyIO provides the spec: the widths/lengths/tiled size the data brings.
    spec = BatchSpec(
        state_width=data_cfg.max_state_dim,
        action_width=data_cfg.max_action_dim,
        chunk_length=cfg.framework.action_model.chunk_length,
        num_frames=len(range(0, len(data_cfg.video_delta_indices), data_cfg.action_video_freq_ratio)),
        frame_size=(data_cfg.image_size[0], data_cfg.image_size[1] * len(data_cfg.camera_keys)),
    )
    with building_outside_deepspeed(accelerator):
        model = build_dit4dit(cfg, spec)
        cache, _ = _build_prompt_cache(cfg, accelerator, instructions, run_dir)
    if cache.nbytes <= PROMPT_CACHE_ON_DEVICE_BYTES:
        cache.to(accelerator.device)
    model.set_prompt_cache(cache)
    freeze_modules(model, cfg.trainer.freeze_modules)
    optimizer = build_optimizer(model, cfg.trainer)
    scheduler = build_scheduler(optimizer, cfg.trainer)
    model, optimizer = accelerator.prepare(model, optimizer)

    sampler = data.sampler
    step = 0
    if resume_from is not None:
        accelerator.load_state(str(resume_from / "state"))
        state = ckpt_io.read_trainer_state(resume_from)
        step = state["step"]
        scheduler.load_state_dict(state["scheduler"])
        sampler.load_state_dict(state["sampler"])
        if is_main:
            _truncate_metrics(run_dir / "metrics.jsonl", step)
        accelerator.print(f"resumed from {resume_from} at step {step}")

    from dit4dit_npu.data import collate

    vla = cfg.datasets.vla_data
    loader = torch.utils.data.DataLoader(
        data.train_dataset,
        batch_size=vla.per_device_batch_size,
        sampler=sampler,
        collate_fn=collate,
        num_workers=vla.num_workers,
        drop_last=True,
        persistent_workers=False,
        # A private generator: creating the iterator must not draw from the global RNG, or a
        # resumed run's dropout/noise would shift by one draw (deepspeed_cpu.md, determinism).
        generator=torch.Generator().manual_seed(cfg.seed),
    )
    logger = MetricsLogger(cfg, run_dir, enabled=is_main)
    trainer_cfg = cfg.trainer
    accum = trainer_cfg.gradient_accumulation_steps
    global_batch = vla.per_device_batch_size * accum * accelerator.num_processes

    progress = None
    if is_main:
        from tqdm.auto import tqdm

        progress = tqdm(total=trainer_cfg.max_train_steps, initial=step, desc="train", dynamic_ncols=True)

    model.train()
    data_iter = iter(loader)
    running = {k: torch.zeros((), device=accelerator.device) for k in ("action_loss", "video_loss", "total_loss")}
    nonfinite = torch.zeros((), device=accelerator.device)
    window_steps, data_time, window_start = 0, 0.0, time.perf_counter()
    grad_norm = None
    use_deepspeed = accelerator.distributed_type == DistributedType.DEEPSPEED

    # Samples this rank has trained on since the current iterator began: the data cursor saved
    # in checkpoints (a prefetching loader has already drawn more indices than that).
    consumed = 0

    def next_batch():
        nonlocal data_iter, consumed
        try:
            batch = next(data_iter)
        except StopIteration:  # the sampler has moved to the next epoch by itself
            data_iter, consumed = iter(loader), 0
            batch = next(data_iter)
        consumed += vla.per_device_batch_size
        return batch

    try:
        while step < trainer_cfg.max_train_steps:
            for _ in range(accum):
                t0 = time.perf_counter()
                batch = _to_device(next_batch(), accelerator.device)
                data_time += time.perf_counter() - t0
                with accelerator.accumulate(model):
                    out = model(batch)
                    # the model returns its losses; their weighting is the trainer's (lambda, SPEC 3.4)
                    out["total_loss"] = out["action_loss"] + trainer_cfg.loss_scale.future_video * out["video_loss"]
                    accelerator.backward(out["total_loss"])
                    if accelerator.sync_gradients and not use_deepspeed:  # DeepSpeed clips itself
                        grad_norm = accelerator.clip_grad_norm_(model.parameters(), trainer_cfg.gradient_clipping)
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                for k in running:
                    running[k] += out[k].detach().float() / accum
                nonfinite += (~torch.isfinite(out["total_loss"].detach())).float()
            scheduler.step()
            step += 1
            window_steps += 1
            if progress is not None:
                progress.update(1)

            log_now = step % trainer_cfg.logging_frequency == 0 or step == trainer_cfg.max_train_steps
            save_now = step % trainer_cfg.save_interval == 0 or step == trainer_cfg.max_train_steps
            eval_now = step % trainer_cfg.eval_interval == 0 or step == trainer_cfg.max_train_steps
            if log_now or save_now:
                if float(accelerator.reduce(nonfinite, "sum")) > 0:
                    raise TrainingError(
                        f"non-finite loss at or before step {step}; stopping without saving "
                        "(last valid checkpoint is kept; try a lower learning rate)"
                    )
            if log_now:
                if use_deepspeed:
                    grad_norm = model.get_global_grad_norm()
                elapsed = time.perf_counter() - window_start
                values = {k: float(accelerator.reduce(v, "mean")) / window_steps for k, v in running.items()}
                values.update(group_lrs(optimizer))
                values.update(
                    grad_norm=float("nan") if grad_norm is None else float(grad_norm),
                    data_time=float(accelerator.reduce(torch.tensor(data_time / window_steps, device=accelerator.device), "mean")),
                    step_time=elapsed / window_steps,
                    samples_per_s=global_batch * window_steps / max(elapsed, 1e-9),
                )
                logger.log(step, values)
                if progress is not None:
                    progress.set_postfix(loss=f"{values['total_loss']:.4f}", refresh=False)
                for v in running.values():
                    v.zero_()
                window_steps, data_time, window_start = 0, 0.0, time.perf_counter()
            t_side = time.perf_counter()
            if eval_now:
                metrics = _evaluate(model, data, cfg, accelerator, step)
                if metrics:
                    logger.log(step, metrics)
            if save_now:
                _save(cfg, accelerator, model, scheduler, sampler.state_dict(consumed), data, cache, run_dir, step)
            # Eval and save time is not training throughput: keep it out of step_time/samples_per_s.
            window_start += time.perf_counter() - t_side
    finally:
        if progress is not None:
            progress.close()
        logger.close()

    if is_main:
        plot_losses(run_dir / "metrics.jsonl", run_dir / "loss.png")
        latest = ckpt_io.list_checkpoints(run_dir)[-1][1]
        accelerator.print(f"done: {step} steps; policy at {latest / 'policy'}")
    accelerator.wait_for_everyone()
    return run_dir


def _save(cfg, accelerator, model, scheduler, sampler_state: dict, data, cache, run_dir: Path, step: int) -> None:
    from dit4dit_npu.policy import folder as policy_folder

    tmp = ckpt_io.tmp_dir_for(run_dir, step)
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp / "state"))  # collective: every rank writes its shards + RNG
    accelerator.wait_for_everyone()
    with gathered_parameters(accelerator, _unwrap(model)):
        if accelerator.is_main_process:
            policy_folder.export_policy(
                tmp / "policy", _unwrap(model), cfg, data.normalizer, cache, data.split, data.dataset_paths, step
            )
    if accelerator.is_main_process:
        ckpt_io.write_trainer_state(tmp, cfg, step, scheduler, sampler_state)
        ckpt_io.commit(tmp, ckpt_io.final_dir_for(run_dir, step))
        ckpt_io.prune(run_dir, cfg.trainer.keep_last_checkpoints)
    accelerator.wait_for_everyone()
