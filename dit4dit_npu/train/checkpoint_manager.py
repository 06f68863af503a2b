"""``CheckpointManager``: one run's saves, resumes and policy exports (the trainer's checkpointing).

The on-disk layout, its atomic commit and pruning are ``checkpoint.py``; which checkpoint a run
continues from, and whether its files are whole, is ``resume.py``. This module moves the run's
state in and out of them: every rank's accelerate/DeepSpeed state, the EMA, the LR schedule, the
data cursor, and the exported policy folder (what inference needs). Every method is collective
(entered by every rank alike): a rank that failed alone would leave the others waiting at the
next barrier forever, so outcomes are agreed on before anyone moves on.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from dit4dit_npu.files import is_out_of_space
from dit4dit_npu.train import checkpoint as ckpt_io
from dit4dit_npu.train import distributed
from dit4dit_npu.train.divergence import DivergenceWatch, blame
from dit4dit_npu.train.ema import EMA, EMA_FILE, averaged
from dit4dit_npu.train.errors import TrainingError
from dit4dit_npu.train.optim import schedule_position


class UnusableCheckpoint(Exception):
    """A checkpoint that passed ``resume.py``'s checks but fails to load or holds non-finite
    state: its one line, for ``run_folder.fall_back`` to set it aside."""


def data_fingerprint(data) -> dict:
    """The split (per data_mix entry, in order) and the PolicyIO a checkpoint was trained with."""
    split = [data.split[str(p)] for p in data.dataset_paths]
    return ckpt_io.data_fingerprint(split, data.io.to_dict())


def latest_checkpoint(run_dir: Path) -> str:
    """Where a stopped run stands, for its one line."""
    done = ckpt_io.list_checkpoints(run_dir)
    return f"the latest checkpoint is still {done[-1][1]}" if done else "no checkpoint was saved yet"


class CheckpointManager:
    def __init__(self, cfg, accelerator, run_dir: Path, model, ema: EMA | None, scheduler, stream, data,
                 prompt_cache, watch: DivergenceWatch) -> None:
        self.cfg, self.accelerator, self.run_dir = cfg, accelerator, run_dir
        self.model, self.ema, self.scheduler, self.stream = model, ema, scheduler, stream
        self.data, self.prompt_cache, self.watch = data, prompt_cache, watch
        self.is_main = accelerator.is_main_process

    # ------------------------------------------------------------------ resume

    def load(self, ckpt: Path) -> tuple[int, float | None]:
        """Load everything ``ckpt`` holds into the run (weights, optimizer, every rank's RNG, the LR
        schedule, the data cursor, the EMA) and return its step and training seconds (None from a
        version that did not record them). ``ckpt`` was checked whole by
        ``resume.py``; what only loading shows is checked here: every file must load (a checkpoint
        of an older version, without content hashes, may hold a file damaged in place) and the
        weights and the EMA must be finite (a checkpoint saved by a version that did not check
        them). Either problem raises ``UnusableCheckpoint`` before the schedule or the data cursor
        are changed (the next load replaces every piece of state this one touched)."""
        if self.ema is not None and not (ckpt / EMA_FILE).is_file():
            raise TrainingError(
                f"{ckpt / EMA_FILE} is missing: {ckpt} was saved without trainer.ema; resume it with "
                "trainer.ema.decay=null, or start a new run (another run_id)"
            )
        state = ckpt_io.read_trainer_state(ckpt)
        failed = self._load_files(ckpt)
        if failed is not None:
            raise UnusableCheckpoint(f"{ckpt} {failed}")
        bad = self.watch.nonfinite_state()
        if bad is not None:
            raise UnusableCheckpoint(f"{ckpt} holds {bad} (a checkpoint of a diverged run)")
        self.scheduler.load_state_dict(state["scheduler"])
        self._warn_if_schedule_moved(ckpt, state)
        self.stream.load_state_dict(state["sampler"])
        saved_world = int(state.get("world_size", self.accelerator.num_processes))
        if saved_world != self.accelerator.num_processes:
            self.accelerator.print(
                f"warning: {ckpt} was saved by {saved_world} rank(s), resuming with "
                f"{self.accelerator.num_processes}: the data order does not continue exactly"
            )
        return state["step"], state.get("train_time_s")

    def _warn_if_schedule_moved(self, ckpt: Path, state: dict) -> None:
        """The scheduler's saved state is its step, not its shape: the learning rate of every later
        update comes from this run's config. A resume with another schedule (above all a larger
        trainer.max_train_steps: extending a finished cosine run) moves the learning rate from
        where the checkpoint left it to where the new curve is at that step (from the second
        update on: the first uses the rate the optimizer state restored). Allowed (extending a
        run is what a larger max_train_steps asks for), but said. Nothing to say when the run is
        already at its end (nothing trains).

        Under trainer.lr_schedule_clock=train_time the schedule continues from the position of the
        restored training seconds. Its saved LR was set a little earlier than the seconds were
        recorded (the save comes after the step boundary's log), so the two never agree to the
        digit: what is compared there is the schedule's shape the checkpoint recorded (the clock,
        max_train_steps, max_train_time_s), and a changed shape is said with the LR it moves to."""
        saved = state["scheduler"].get("_last_lr")
        lambdas = getattr(self.scheduler, "lr_lambdas", None)  # transformers' schedules are LambdaLR
        t = self.cfg.trainer
        step = self.scheduler.last_epoch  # the step the schedule continues from
        was_clock, was_budget = state.get("lr_schedule_clock", "steps"), state.get("max_train_time_s")
        by_time = "train_time" in (was_clock, t.lr_schedule_clock)
        if by_time and (was_clock, state.get("max_train_steps"), was_budget) == (
                t.lr_schedule_clock, t.max_train_steps, t.max_train_time_s):
            return
        position, seconds = float(step), state.get("train_time_s")
        if t.lr_schedule_clock == "train_time" and seconds is not None:
            position = schedule_position(step, seconds, t.max_train_steps, t.max_train_time_s)
        if not saved or lambdas is None or position >= t.max_train_steps:
            return
        now = [base * f(position) for base, f in zip(self.scheduler.base_lrs, lambdas)]
        if all(abs(a - b) <= 1e-6 * max(abs(a), abs(b), 1e-12) for a, b in zip(saved, now)):
            return
        was = state.get("max_train_steps")  # (not recorded by older versions)
        if was is not None and was != t.max_train_steps:
            what = f"a {was}-step schedule, this run's has {t.max_train_steps} steps"
        elif by_time:
            what = (f"a schedule by trainer.lr_schedule_clock={was_clock} (max_train_time_s={was_budget}), this "
                    f"run's is by {t.lr_schedule_clock} (max_train_time_s={t.max_train_time_s})")
        else:
            what = "another learning-rate schedule than this run's"
        group = self.scheduler.optimizer.param_groups[0].get("name", "0")
        where = f" (schedule position {position:.1f}, by its training seconds)" if position != step else ""
        self.accelerator.print(
            f"warning: {ckpt} was trained on {what} ({t.lr_scheduler_type}): the learning rate "
            f"({group}) at step {step}{where} moves from {saved[0]:.2e} to {now[0]:.2e}; a new run_id starts a "
            "schedule of its own"
        )

    def _load_files(self, ckpt: Path) -> str | None:
        """Load the accelerate state and the EMA of ``ckpt``; None, or why a file failed to load.
        A file that fails on one rank (its own RNG state) fails the load on every rank. Any
        exception counts: torch.load, pickle and safetensors raise many types for a damaged
        file, and what they name is the checkpoint's problem, not this run's."""
        error = None
        try:
            distributed.load_state(self.accelerator, ckpt / "state")
            if self.ema is not None:
                self.ema.load(ckpt)
        except Exception as e:
            error = f"fails to load ({type(e).__name__}: {ckpt_io.one_line(e, 160)})"
        failed = torch.tensor(float(error is not None), device=self.accelerator.device)
        if float(self.accelerator.reduce(failed, "sum")) == 0:
            return None
        return error or "fails to load on another rank"

    # ------------------------------------------------------------------ save

    def save(self, step: int, train_time_s: float | None = None) -> None:
        """A full checkpoint (of ``step``, after ``train_time_s`` training seconds), written into ``.tmp-step_N`` and renamed into place only when
        complete: accelerate/DeepSpeed state of every rank, the exported policy, the trainer state
        and last the manifest. Never saves a diverged model. A failed save (a full disk above
        all) removes its partial folder and stops every rank with one line; the previous
        checkpoint stays the latest."""
        acc = self.accelerator
        bad = self.watch.nonfinite_state()  # collective: every rank stops alike
        if bad is not None:
            suspect = self.watch.suspect(step)
            why = blame(suspect) if suspect else "the run diverged; try a lower learning rate"
            raise TrainingError(f"checkpoint step {step} not saved: {bad} ({why}); {self.latest()}")
        tmp = ckpt_io.tmp_dir_for(self.run_dir, step)
        error = self._on_every_rank(lambda: self._make_folder(tmp))
        if error is None and distributed.uses_deepspeed(acc) and acc.num_processes > 1:
            self._save_shards_or_stop(tmp, step)
        elif error is None:
            error = self._on_every_rank(lambda: distributed.save_state(acc, tmp / "state"))
        if error is None:
            # ZeRO-3 gathers for the export; the EMA shards meet on rank 0 and in the model for
            # the export: entered by every rank.
            with distributed.gathered_parameters(acc, distributed.unwrap(self.model)), averaged(self.ema):
                ema = self.ema.full_state_dict() if self.ema is not None else None
                error = self._on_every_rank(lambda: self._write_rest(tmp, step, ema, train_time_s))
        if error is not None:
            if self.is_main:
                shutil.rmtree(tmp, ignore_errors=True)
            raise self._save_error(error, tmp, step)
        if self.is_main:  # the checkpoint just saved was checked: it is never pruned
            ckpt_io.prune(
                self.run_dir, self.cfg.trainer.keep_last_checkpoints, protect=ckpt_io.final_dir_for(self.run_dir, step)
            )
        acc.wait_for_everyone()

    def _save_shards_or_stop(self, tmp: Path, step: int) -> None:
        """Every rank's shards under DeepSpeed with several ranks. A rank whose write fails (its
        disk full, a file-size limit) cannot agree on the outcome with the others (``_on_every_rank``):
        they wait in DeepSpeed's own barrier after the shards, which it never reaches, and a
        collective it entered instead would leave both waiting out trainer.collective_timeout_s.
        It stops at once with its one line; the others stop when its
        connection closes (``distributed.stop_on_lost_rank``), and the partial folder is removed
        at the next start, as after a kill."""
        try:
            distributed.save_state(self.accelerator, tmp / "state")
        except Exception as e:
            if not is_out_of_space(e):
                raise  # a bug: its traceback
            raise TrainingError(
                f"checkpoint step {step} not saved: no space left on rank {self.accelerator.process_index} writing "
                f"{tmp} ({ckpt_io.one_line(e)}); every rank stops, the partial folder is removed at the next start, "
                f"{self.latest()}"
            ) from None

    def _make_folder(self, tmp: Path) -> None:
        if self.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)

    def _write_rest(self, tmp: Path, step: int, ema: dict[str, torch.Tensor] | None,
                    train_time_s: float | None) -> None:
        """Rank 0's part of a save; the model holds the EMA weights when on (see ``save``)."""
        if not self.is_main:
            return
        self._export_policy(tmp / "policy", step)
        if ema is not None:
            EMA.save(ema, tmp)
        world = self.accelerator.num_processes
        ckpt_io.write_trainer_state(
            tmp, self.cfg, data_fingerprint(self.data), step, self.scheduler, self.stream.state_dict(), world,
            train_time_s,
        )
        ckpt_io.write_manifest(tmp)
        ckpt_io.commit(tmp, ckpt_io.final_dir_for(self.run_dir, step))

    def _on_every_rank(self, fn) -> BaseException | None:
        """Run ``fn`` on every rank and agree on the outcome. Returns this rank's error, or a
        stand-in when only another rank failed."""
        error: BaseException | None = None
        try:
            fn()
        except Exception as e:
            error = e
        flag = torch.tensor(0.0 if error is None else 1.0, device=self.accelerator.device)
        if float(self.accelerator.reduce(flag, "sum")) > 0 and error is None:
            error = TrainingError("another rank failed to write its part of the checkpoint")
        return error

    def _save_error(self, error: BaseException, tmp: Path, step: int) -> BaseException:
        """One line for a full disk; any other failure is re-raised as it is (a bug)."""
        if not is_out_of_space(error):
            return error
        return TrainingError(
            f"checkpoint step {step} not saved: no space left writing {tmp} "
            f"({ckpt_io.one_line(error)}); removed the partial folder, {self.latest()}"
        )

    def latest(self) -> str:
        return latest_checkpoint(self.run_dir)

    # ------------------------------------------------------------------ export

    def export(self, folder: Path, step: int) -> None:
        """The policy of the weights it would hold (the EMA's when on) into ``folder``
        (``trainer.sim_eval``). Collective, as in ``save``: ZeRO-3 gathers, the EMA shards meet in
        the model."""
        with distributed.gathered_parameters(self.accelerator, distributed.unwrap(self.model)), averaged(self.ema):
            if self.is_main:
                self._export_policy(folder, step)

    def _export_policy(self, folder: Path, step: int) -> None:
        """What inference needs (weights, config, PolicyIO, prompt cache), from rank 0."""
        from dit4dit_npu.policy import folder as policy_folder

        d = self.data
        policy_folder.export_policy(
            folder, distributed.unwrap(self.model), self.cfg, d.io, self.prompt_cache, d.split, d.dataset_paths, step
        )
