"""``Trainer``: one run's training state and its verbs, ``step / log / evaluate / save / resume``.

The loop that calls them is ``loop.py``. What differs between DeepSpeed and plain accelerate
(who clips, the global grad norm, ZeRO state, ZeRO-3 gathering) is behind ``distributed``;
saving, resuming and exporting the policy are the ``CheckpointManager``'s
(``checkpoint_manager.py``), stopping a diverged run is ``divergence.py``'s. Host syncs
(``.item()``, reductions) happen only in ``log``, ``evaluate`` and ``save``, never in ``step``.

The methods under "batches and outputs" (``_collate``, ``_to_device``, ``_targets``, ``_losses``)
are where this file meets the batch type (``dit4dit_npu/batch.py``) and the model's outputs; a
change to either lands there, a few lines each.
"""

from __future__ import annotations

import contextlib
import math
import shutil
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch

from dit4dit_npu.batch import Batch
from dit4dit_npu.config import Config, ConfigError, TrainerConfig
from dit4dit_npu.train import checkpoint as ckpt_io
from dit4dit_npu.train import distributed
from dit4dit_npu.train.budget import TrainClock
from dit4dit_npu.train.checkpoint_manager import CheckpointManager, UnusableCheckpoint
from dit4dit_npu.train.divergence import DivergenceWatch
from dit4dit_npu.train.ema import EMA, averaged
from dit4dit_npu.train.evaluate import held_out_action_mse
from dit4dit_npu.train.metrics import MetricsLogger, Window, plot_losses, truncate_metrics
from dit4dit_npu.train.optim import (
    build_optimizer,
    build_scheduler,
    group_lrs,
    place_schedule,
    schedule_position,
)
from dit4dit_npu.train.stream import BatchStream

LOSS_KEYS = ("action_loss", "video_loss", "total_loss")
CLOCKS = {"wall": time.perf_counter, "process_cpu": time.process_time}  # trainer.train_time_clock


def check_ema_supported(cfg: Config, accelerator) -> None:
    """EMA averages the module's whole parameters, which ZeRO-3 never holds: each rank keeps a
    shard of every weight and the module only empty placeholders outside a gather."""
    if cfg.trainer.ema.decay is not None and distributed.zero_stage(accelerator) == 3:
        raise ConfigError(
            f"trainer.ema: not supported with ZeRO-3 ({cfg.trainer.deepspeed_config}); "
            "use ZeRO-2 or set trainer.ema.decay=null"
        )


def has_video_loss(t: TrainerConfig, step: int, seconds: float) -> bool:
    """Whether optimizer update ``step`` (0-based) of a joint run has the video loss, ``seconds``
    into the training: ``t.video_loss_interval`` (steps 0, k, 2k, ...) and ``in_video_loss_span``."""
    return step % t.video_loss_interval == 0 and in_video_loss_span(t, step, seconds)


def in_video_loss_span(t: TrainerConfig, step: int, seconds: float) -> bool:
    """Whether the share of the training done lies in ``t.video_loss_span``: the step count's share
    of ``max_train_steps``, or with a budget the further of that and the budget's share spent (the
    LR schedule's position under ``lr_schedule_clock=train_time``)."""
    limit = t.max_train_time_s if t.max_train_time_s is not None else math.inf
    share = schedule_position(step, seconds, t.max_train_steps, limit) / t.max_train_steps
    start, end = t.video_loss_span
    return start <= share < end  # a step that runs is short of the end: share < 1


class Trainer:
    def __init__(self, cfg: Config, accelerator, model, data, prompt_cache, run_dir: Path):
        """Build the optimizer and LR schedule and hand the model to accelerate/DeepSpeed."""
        self.cfg, self.accelerator, self.run_dir = cfg, accelerator, run_dir
        self.data, self.prompt_cache = data, prompt_cache
        self.is_main = accelerator.is_main_process
        # What this rank is doing, for the one line a collective that another rank never joined
        # becomes (distributed.stop_on_lost_rank): the wait it was in.
        self.activity = "preparing the model and optimizer"
        optimizer = build_optimizer(model, cfg.trainer)
        # The schedule steps the plain optimizer once per update (never per micro-batch).
        self.scheduler = build_scheduler(optimizer, cfg.trainer)
        self.model, self.optimizer = accelerator.prepare(model, optimizer)
        self.ema = self._build_ema(cfg, accelerator, distributed.unwrap(self.model))
        vla = cfg.datasets.vla_data
        self.stream = BatchStream(
            data.train_dataset, data.sampler, vla.per_device_batch_size, vla.num_workers, cfg.seed, self._collate
        )
        self.global_step = 0
        self.global_batch = vla.per_device_batch_size * cfg.trainer.gradient_accumulation_steps * accelerator.num_processes
        # Running sums on the device: reading them forces a host sync, so only log() does.
        dev = accelerator.device
        self._running = {k: torch.zeros((), device=dev) for k in LOSS_KEYS}
        self._nonfinite = torch.zeros((), device=dev)  # micro-batches with a non-finite loss, ever
        self._clip_norm = None  # accelerate's grad norm of the last update (unused under DeepSpeed)
        self._window = Window()
        # training seconds (trainer.max_train_time_s, trainer.save_every_s: budget.py)
        self.clock = TrainClock(cfg.trainer.max_train_time_s, cfg.trainer.save_every_s,
                                CLOCKS[cfg.trainer.train_time_clock])
        self.out_of_time = False  # the budget is spent: the loop stops at this step
        self._boundary_seconds = 0.0  # training seconds at the last step boundary (rank 0's)
        self._in_video_span = True  # whether the last step was in trainer.video_loss_span
        self._time_mark = False  # this step boundary is a time checkpoint (or the budget's stop)
        self.watch = DivergenceWatch(accelerator, self.model, self.ema)
        self.checkpoints = CheckpointManager(cfg, accelerator, run_dir, self.model, self.ema, self.scheduler,
                                             self.stream, data, prompt_cache, self.watch)
        self._logger: MetricsLogger | None = None
        self._progress = None

    # ------------------------------------------------------------------ the verbs

    def resume(self, ckpt: Path) -> str | None:
        """Continue exactly where ``ckpt`` left off (``CheckpointManager.load``). Metrics rows
        logged after that checkpoint (and a line torn by a kill) are dropped. Returns None, or why
        ``ckpt`` cannot be used, as one line, before anything else is changed (the caller sets
        ``ckpt`` aside and falls back). Collective."""
        self.activity = f"resuming from {ckpt}"
        try:
            self.global_step, seconds = self.checkpoints.load(ckpt)
        except UnusableCheckpoint as e:
            return str(e)
        # a budget's seconds (recorded, on this run's clock) were checked with the config: resume.check_train_time
        self.clock.restore(seconds)
        self._boundary_seconds = self.clock.seconds
        self.out_of_time = self.clock.spent()
        self._truncate_metrics(self.global_step)
        self.watch.resumed_from = ckpt
        self.accelerator.print(f"resumed from {ckpt} at step {self.global_step}")
        return None

    def start_fresh(self) -> None:
        """A fresh run in a folder without checkpoints: rows of an earlier attempt that died
        before its first checkpoint would otherwise mix into this run's metrics."""
        self._truncate_metrics(0)

    def _truncate_metrics(self, step: int) -> None:
        if self.is_main:
            dropped = truncate_metrics(self.run_dir / "metrics.jsonl", step)
            if dropped:
                self.accelerator.print(f"dropped {dropped} unreadable (torn) line(s) of {self.run_dir / 'metrics.jsonl'}")

    def step(self) -> None:
        """One optimizer update: gradient_accumulation_steps micro-batches, then the LR schedule."""
        accum = self.cfg.trainer.gradient_accumulation_steps
        self._time_mark = False
        self.activity = f"training step {self.global_step + 1}"
        forward = self._forward if self._has_video_loss() else self._forward_no_video
        for _ in range(accum):
            with self._window.loading():
                batch = self._to_device(self.stream.next())
            out, norm = distributed.micro_step(
                self.accelerator, self.model, self.optimizer, forward, batch, self.cfg.trainer.gradient_clipping
            )
            if norm is not None:
                self._clip_norm = norm
            for k in LOSS_KEYS:
                self._running[k] += out[k].detach().float() / accum
            self._nonfinite += (~torch.isfinite(out["total_loss"].detach())).float()
        self.scheduler.step()  # under trainer.lr_schedule_clock=train_time, check_clock then places it
        self.global_step += 1
        if self.ema is not None:
            self.ema.update(self.global_step)
        self._window.steps += 1
        if self._progress is not None:
            self._progress.update(1)

    def _has_video_loss(self) -> bool:
        """Whether this step has the video loss (``has_video_loss``), on rank 0's seconds at the last
        step boundary: every rank decides alike. A resumed run continues from the step count and the
        seconds its checkpoint recorded (taken at the save, a little after that boundary: a step right
        at a span's edge may fall on the other side). Says when the run enters or leaves
        ``trainer.video_loss_span``."""
        t = self.cfg.trainer
        in_span = in_video_loss_span(t, self.global_step, self._boundary_seconds)
        if in_span != self._in_video_span:
            self._in_video_span = in_span
            every = f" (on every {t.video_loss_interval}-th step)" if t.video_loss_interval > 1 else ""
            self.accelerator.print(f"step {self.global_step + 1}: the video loss {'on' if in_span else 'off'}{every}: "
                                   f"{'inside' if in_span else 'outside'} trainer.video_loss_span={t.video_loss_span}")
        return has_video_loss(t, self.global_step, self._boundary_seconds)

    def due(self, every: int) -> bool:
        """Every ``every`` steps, and always at the last step (the budget's stop included) and at
        a time checkpoint (``trainer.save_every_s``)."""
        return self.global_step % every == 0 or self.global_step == self.cfg.trainer.max_train_steps or self._time_mark

    def check_clock(self) -> None:
        """At a step boundary: is the budget spent, is a time checkpoint due (``budget.py``)? Every
        rank decides on rank 0's count (a stop and a save are collective). Under
        ``trainer.lr_schedule_clock=train_time`` the LR of the next update follows that same count
        (``optim.schedule_position``): every rank sets the same LR."""
        if not self.clock.enabled:
            return
        seconds = self.clock.seconds
        if self.accelerator.num_processes > 1:
            from accelerate.utils import broadcast

            # float32: every collective backend takes it (HCCL's float64 support varies); every rank
            # gets the same rounded value, so all decide alike
            seconds = float(broadcast(torch.tensor([seconds], dtype=torch.float32, device=self.accelerator.device))[0])
        self.out_of_time, self._time_mark = self.clock.crossed(seconds)
        self._boundary_seconds = seconds
        t = self.cfg.trainer
        if t.lr_schedule_clock == "train_time":
            place_schedule(self.scheduler, schedule_position(self.global_step, seconds, t.max_train_steps,
                                                             t.max_train_time_s))

    def log(self) -> None:
        """One metrics row: losses and data/step time averaged over ranks and over the steps since
        the last row, per-group LRs, the global grad norm, throughput."""
        self.activity = f"logging step {self.global_step}"
        self._stop_if_nonfinite()
        acc, w = self.accelerator, self._window
        grad_norm = distributed.global_grad_norm(acc, self.model, self._clip_norm)
        elapsed = w.elapsed
        values = {k: float(acc.reduce(v, "mean")) / w.steps for k, v in self._running.items()}
        values.update(group_lrs(self.optimizer))
        data_time = torch.tensor(w.data_time / w.steps, device=acc.device)
        values.update(
            grad_norm=float("nan") if grad_norm is None else float(grad_norm),
            data_time=float(acc.reduce(data_time, "mean")),
            step_time=elapsed / w.steps,
            samples_per_s=self.global_batch * w.steps / max(elapsed, 1e-9),
        )
        if self.clock.known:
            values["train_time_s"] = self.clock.seconds
        self._logger.log(self.global_step, values)
        if self._progress is not None:
            self._progress.set_postfix(loss=f"{values['total_loss']:.4f}", refresh=False)
        for v in self._running.values():
            v.zero_()
        w.reset()

    def evaluate(self) -> None:
        """Held-out action MSE in eval mode (``evaluate.py``), logged as ``val/action_mse``; of the
        EMA weights when ``trainer.ema`` is on (the weights the exported policy holds)."""
        self.activity = f"evaluating at step {self.global_step}"
        with self._not_training(), averaged(self.ema):
            t = self.cfg.trainer
            metrics = held_out_action_mse(
                distributed.unwrap(self.model),
                self.data.val_dataset,
                samples=t.eval_samples,
                batch_size=self.cfg.datasets.vla_data.per_device_batch_size,
                # one seed for every eval: the same noise at each step, so the curve shows the
                # weights changing, not the draw (seed + step swung it 2x between neighbours)
                seed=self.cfg.seed,
                accelerator=self.accelerator,
                make_batch=lambda samples: self._to_device(self._collate(samples)),
                targets=self._targets,
            )
            if metrics:
                self._logger.log(self.global_step, metrics)

    def sim_evaluate(self) -> None:
        """Closed-loop success in simulation (``trainer.sim_eval``) of the weights the policy would
        hold (the EMA's when on), logged as ``sim/success_rate`` and ``sim/mean_max_reward``. The
        policy is exported to ``sim_eval/step_N/policy`` and evaluated there by the simulator in a
        subprocess (``sim/training_eval.py``); the folder keeps results.json and the eval's log,
        the weights are removed after. A failed eval is one warning line; training goes on."""
        from dit4dit_npu.sim.training_eval import SimEvalFailed, evaluate

        self.activity = f"running the closed-loop evaluation at step {self.global_step}"

        with self._not_training():
            acc, step = self.accelerator, self.global_step
            folder = self.run_dir / "sim_eval" / f"step_{step:06d}"
            if self.is_main:
                shutil.rmtree(folder, ignore_errors=True)
            self.checkpoints.export(folder / "policy", step)  # collective
            if self.is_main:
                try:
                    self._logger.log(step, evaluate(folder / "policy", self.cfg.trainer.sim_eval, folder))
                except SimEvalFailed as e:
                    acc.print(f"warning: sim eval at step {step} failed ({e}); training goes on")
                finally:
                    shutil.rmtree(folder / "policy", ignore_errors=True)
            acc.wait_for_everyone()

    def save(self) -> None:
        """A full checkpoint of this step (``CheckpointManager.save``: atomic, never of a diverged
        model; a failed save stops every rank with one line)."""
        self.activity = f"saving checkpoint step {self.global_step}"
        self._stop_if_nonfinite()
        with self._not_training():
            self.checkpoints.save(self.global_step, self.clock.seconds if self.clock.known else None)

    @contextlib.contextmanager
    def session(self) -> Iterator[None]:
        """Metrics logger and progress bar around the loop, closed however the loop ends."""
        self._logger = MetricsLogger(self.cfg, self.run_dir, enabled=self.is_main)
        if self.is_main:
            from tqdm.auto import tqdm

            t = self.cfg.trainer
            self._progress = tqdm(total=t.max_train_steps, initial=self.global_step, desc="train", dynamic_ncols=True)
        self.model.train()
        self._window.reset()
        self.clock.start()
        try:
            yield
        finally:
            self.clock.stop()
            if self._progress is not None:
                self._progress.close()
            self._logger.close()

    def finish(self) -> None:
        """loss.png next to metrics.jsonl, and where the policy is."""
        self.activity = "finishing, after the last step"
        if self.is_main:
            plot_losses(self.run_dir / "metrics.jsonl", self.run_dir / "loss.png")
            latest = ckpt_io.final_dir_for(self.run_dir, self.global_step)
            budget = ""
            if self.out_of_time:
                budget = (f" (trainer.max_train_time_s={self.cfg.trainer.max_train_time_s:g} spent: "
                          f"{self.clock.seconds:.1f} s of training)")
            self.accelerator.print(f"done: {self.global_step} steps{budget}; policy at {latest / 'policy'}")
        self.accelerator.wait_for_everyone()

    # ------------------------------------------------------------------ internals

    @staticmethod
    def _build_ema(cfg: Config, accelerator, model) -> EMA | None:
        """The average of the trainable weights of the (unwrapped) model, or None when off."""
        if cfg.trainer.ema.decay is None:
            return None
        check_ema_supported(cfg, accelerator)
        return EMA(model, cfg.trainer.ema, accelerator.process_index, accelerator.num_processes)

    @contextlib.contextmanager
    def _not_training(self) -> Iterator[None]:
        """An evaluation or a save: out of the throughput and out of the training seconds."""
        with self._window.paused(), self.clock.paused():
            yield

    def _stop_if_nonfinite(self) -> None:
        self.watch.stop_if_nonfinite(self._nonfinite, self.global_step)

    def _forward(self, batch) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        losses = self._losses(self.model(batch))
        return losses, losses["total_loss"]

    def _forward_no_video(self, batch) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """A joint step without its video loss (``trainer.video_loss_interval``)."""
        losses = self._losses(self.model(batch, video_loss=False))
        return losses, losses["total_loss"]

    # ------------------------------------------------------------------ batches and outputs

    def _collate(self, samples: Sequence[dict]) -> Batch:
        return Batch.collate(samples)

    def _to_device(self, batch: Batch) -> Batch:
        """The one place a batch moves to the device."""
        return batch.to(self.accelerator.device)

    @staticmethod
    def _targets(batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """The normalized action chunk and its real-dims mask."""
        return batch.action, batch.action_mask

    def _losses(self, out: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The objective, total = action + lambda * video (the original's objective).

        The trainer owns the weighting (trainer.loss_scale.future_video); the model only reports
        its two losses (a loss the training mode lacks is 0).
        """
        action, video = out["action_loss"], out["video_loss"]
        total = action + self.cfg.trainer.loss_scale.future_video * video
        return {"action_loss": action, "video_loss": video, "total_loss": total}
