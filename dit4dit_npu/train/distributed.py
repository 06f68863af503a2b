"""accelerate + DeepSpeed (ZeRO-2 by default) on NPU, CUDA or CPU, behind a few small functions.

Everything that differs between DeepSpeed and plain accelerate lives here, so the trainer never
asks which one runs: building the accelerator (the DeepSpeed json, the CPU shared-memory op),
one optimizer micro-step (who clips), the global gradient norm, saving and loading the full
state, and gathering ZeRO-3 shards for export. The same code path runs everywhere; only the
device layer's answers differ (hccl/nccl/gloo). Launch with `accelerate launch ... -m
dit4dit_npu.train` or plainly with `python -m` (one process).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dit4dit_npu import device
from dit4dit_npu.config import Config, ConfigError
from dit4dit_npu.errors import DiT4DiTError
from dit4dit_npu.train.errors import TrainingError

if TYPE_CHECKING:
    import torch

REPO_ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ensure_single_process_env() -> None:
    """A bare `python -m dit4dit_npu.train` is a world of one.

    DeepSpeed otherwise falls back to MPI discovery (ModuleNotFoundError: mpi4py); torchrun and
    accelerate set these variables themselves, so we only fill what is missing.
    """
    if "LOCAL_RANK" in os.environ:
        return
    os.environ.update(
        {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}
    )
    os.environ.setdefault("MASTER_PORT", str(_free_port()))


def resolve_path(path: str) -> Path:
    """Config paths are relative to the working directory, falling back to the repo root."""
    p = Path(path)
    if p.is_absolute() or p.exists():
        return p
    return REPO_ROOT / p


def deepspeed_config(cfg: Config, world_size: int) -> dict:
    """Load the DeepSpeed json and fill the batch fields that depend on this run."""
    path = resolve_path(cfg.trainer.deepspeed_config or "")
    if not path.is_file():
        raise ConfigError(f"trainer.deepspeed_config: file not found: {path}")
    try:
        ds = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"trainer.deepspeed_config: {path} is not valid JSON ({e})") from None
    micro = cfg.datasets.vla_data.per_device_batch_size
    accum = cfg.trainer.gradient_accumulation_steps
    # We never hand the DataLoader to accelerate (our sampler shards by rank itself), so "auto"
    # batch sizes cannot be inferred: fill them here.
    ds["train_micro_batch_size_per_gpu"] = micro
    ds["gradient_accumulation_steps"] = accum
    ds["train_batch_size"] = micro * accum * world_size
    ds["gradient_clipping"] = cfg.trainer.gradient_clipping
    # Parameters stay fp32 (DeepSpeed's bf16 mode would cast the fp32 action head to bf16);
    # the video pass runs under bf16 autocast on the device type instead.
    ds["bf16"] = {"enabled": False}
    ds.pop("fp16", None)
    return ds


def _disable_cpu_shm_op() -> None:
    # DeepSpeed JIT-compiles a shared-memory all-reduce op (g++, 26-77 s) at its first
    # init_distributed on the CPU accelerator. Only inference_all_reduce uses it, never training.
    # Marking it incompatible in DeepSpeed's own op table (a dict it keeps for exactly this
    # purpose) makes TorchBackend use plain gloo collectives. CPU only.
    import deepspeed.ops
    from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder

    deepspeed.ops.__compatible_ops__[ShareMemCommBuilder.NAME] = False


def build_accelerator(cfg: Config):
    from accelerate import Accelerator
    from accelerate.utils import DeepSpeedPlugin, DistributedDataParallelKwargs, InitProcessGroupKwargs

    ensure_single_process_env()
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    device.check_local_ranks(int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1"))))
    os.environ.setdefault("DS_ACCELERATOR", device.deepspeed_accelerator_name())
    kwargs: dict = {
        "gradient_accumulation_steps": cfg.trainer.gradient_accumulation_steps,
        # Autocast is applied inside the model on the device layer's type, so accelerate's own
        # mixed precision stays off (it would also wrap the fp32 action head).
        "mixed_precision": "no",
        # An explicit backend makes accelerate read world size/rank from torch.distributed
        # (without it accelerate 1.15 reports num_processes=1 on CPU under DeepSpeed).
        # The timeout reaches torch.distributed.init_process_group through accelerate, and through
        # deepspeed.init_distributed under DeepSpeed: every later collective of the group waits at
        # most this long for a peer (a caller's existing process group keeps its own).
        "kwargs_handlers": [InitProcessGroupKwargs(
            backend=device.dist_backend(), timeout=timedelta(seconds=cfg.trainer.collective_timeout_s)
        )],
    }
    if cfg.trainer.deepspeed_config:
        if device.device_type() == device.CPU:
            _disable_cpu_shm_op()
        ds = deepspeed_config(cfg, world_size)
        kwargs["deepspeed_plugin"] = DeepSpeedPlugin(hf_ds_config=ds, zero3_init_flag=False)
    else:
        # Without DeepSpeed, several processes (or a caller's process group) mean DDP, which fails
        # on parameters that get no gradient, and some always do: the blocks after extract_layer
        # when no video loss is trained (training: action, or one-frame clips).
        kwargs["kwargs_handlers"].append(DistributedDataParallelKwargs(find_unused_parameters=True))
        if device.device_type() == device.CPU:
            kwargs["cpu"] = True
    return Accelerator(**kwargs)


@contextlib.contextmanager
def building_outside_deepspeed(accelerator) -> Iterator[None]:
    """Build models whole, whatever the ZeRO stage.

    accelerate always registers its DeepSpeed config with transformers, so under ZeRO-3 every
    transformers model constructed afterwards is partitioned at construction (zero.Init),
    including the text encoder, which never enters DeepSpeed (it only fills the prompt cache)
    and then fails on its 1-D placeholder weights. ZeRO-3 still partitions the trained model at
    accelerator.prepare().
    """
    plugin = accelerator.state.deepspeed_plugin
    if plugin is None:
        yield
        return
    from transformers.integrations import unset_hf_deepspeed_config

    unset_hf_deepspeed_config()
    try:
        yield
    finally:
        plugin.set_deepspeed_weakref()


def time_out_every_group(accelerator, timeout_s: float) -> None:
    """``trainer.collective_timeout_s`` on every process group, DeepSpeed's own included; call it
    once the model is prepared. init_process_group's timeout covers the default group only:
    DeepSpeed creates its data-parallel group (ZeRO's gradient reduction, the global grad norm)
    with ``new_group`` and no timeout, which torch then sets to its own default, 30 min under gloo
    (a rank stopped mid-step held the other in the grad norm's all-reduce past a 15 s timeout).
    torch lists the groups only in ``distributed_c10d._world``, and sets a group's timeout with
    ``set_timeout`` (``_set_pg_timeout`` before it was public): there is no other way to reach
    groups a library made. A backend that cannot change its timeout keeps it (torch warns); one
    process has no peer to wait for, and a caller's group keeps its own."""
    if accelerator.num_processes == 1:
        return
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    set_timeout = getattr(dist, "set_timeout", None) or c10d._set_pg_timeout
    for group in list(c10d._world.pg_map):
        set_timeout(timedelta(seconds=timeout_s), group)


@contextlib.contextmanager
def stop_on_lost_rank(accelerator, timeout_s: float, doing: Callable[[], str], latest: Callable[[], str]) -> Iterator[None]:
    """A collective that fails because another rank died (its connection closed) or stalled (the
    process group's timeout, ``trainer.collective_timeout_s``, ran out) becomes one line naming
    this rank, what it was doing (``doing()``: the wait) and the newest checkpoint (``latest()``),
    instead of the backend's traceback. Which rank died is the launcher's report (torchrun names
    the first to fail, with its exit code or signal). One process: nothing to lose, left alone."""
    try:
        yield
    except DiT4DiTError:
        raise  # already one line (an inner stop_on_lost_rank's among them)
    except Exception as e:
        kind = device.collective_failure(e) if accelerator.num_processes > 1 else None
        if kind is None:
            raise
        me = f"rank {accelerator.process_index}"
        if kind == "timeout":
            what = (f"{me} waited {timeout_s:g} s (trainer.collective_timeout_s) for the other ranks in a collective "
                    f"while {doing()}: another rank stalled")
        else:
            what = (f"{me} lost another rank while {doing()} (its connection closed: it died; the launcher's report "
                    "names it)")
        raise TrainingError(f"{what}; stopping; {latest()}; trainer.resume=auto continues from it") from None


def gather_from_ranks(accelerator) -> Callable[[Any], list[Any]] | None:
    """A collective for start-up checks: every rank's (picklable) value, in rank order, on every
    rank; None with one process."""
    if accelerator.num_processes == 1:
        return None
    from accelerate.utils import gather_object

    return lambda value: gather_object([value])


def zero_stage(accelerator) -> int | None:
    """The DeepSpeed ZeRO stage, or None without DeepSpeed."""
    plugin = accelerator.state.deepspeed_plugin
    return None if plugin is None else plugin.zero_stage


def gathered_parameters(accelerator, module):
    """Under ZeRO-3 each rank holds a shard of every weight: gather them (collective: every rank
    enters) so rank 0 can export whole tensors. A no-op for ZeRO-2 and without DeepSpeed."""
    if zero_stage(accelerator) != 3:
        return contextlib.nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=None)


# --------------------------------------------------------------------------------------------
# What the trainer calls: it never asks whether DeepSpeed runs
# --------------------------------------------------------------------------------------------


def uses_deepspeed(accelerator) -> bool:
    return accelerator.state.deepspeed_plugin is not None


def unwrap(model):
    """The DiT4DiT module inside a DeepSpeed engine / DDP wrapper (itself when unwrapped)."""
    return getattr(model, "module", model)


def micro_step(
    accelerator, model, optimizer, forward: Callable[[Any], tuple[dict, torch.Tensor]], batch: Any, max_norm: float
) -> tuple[dict, torch.Tensor | float | None]:
    """One micro-batch: ``forward(batch) -> (outputs, loss)``, backward, clip, optimizer step (a
    no-op until the last of the accumulated micro-batches). Returns (outputs, grad norm or None).

    The forward runs inside ``accelerator.accumulate`` so DDP skips the gradient all-reduce of
    micro-batches that do not step. DeepSpeed clips inside its engine step (the json's
    ``gradient_clipping``, filled by ``deepspeed_config``); without it accelerate clips, and only
    on the syncing micro-batch, whose norm is the one worth logging.
    """
    grad_norm = None
    with accelerator.accumulate(model):
        out, loss = forward(batch)
        accelerator.backward(loss)
        if accelerator.sync_gradients and not uses_deepspeed(accelerator):
            grad_norm = accelerator.clip_grad_norm_(model.parameters(), max_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return out, grad_norm


def global_grad_norm(accelerator, model, last_clip_norm):
    """The gradient norm of the last optimizer step, over every rank's shard.

    DeepSpeed's engine computes it during its own clipping (one ZeRO shard alone would give a
    partial norm); without DeepSpeed it is what ``micro_step``'s clipping returned.
    """
    return model.get_global_grad_norm() if uses_deepspeed(accelerator) else last_clip_norm


def share_from_main(accelerator, obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank (a picklable value; collective: every rank calls it)."""
    if accelerator.num_processes == 1:
        return obj
    from accelerate.utils import broadcast_object_list

    box = [obj]
    broadcast_object_list(box, from_process=0)
    return box[0]


def save_state(accelerator, folder: Path) -> None:
    """Model, optimizer (each rank's ZeRO shard) and every rank's RNG. Collective: all ranks call."""
    accelerator.save_state(str(folder))


def load_state(accelerator, folder: Path) -> None:
    """The inverse of ``save_state``, RNG included (that is what makes resume exact). Collective."""
    accelerator.load_state(str(folder))
