"""Where a joint step's gradient goes: the action loss's and the weighted video loss's gradients,
apart, per part of the model, at a run's checkpoints.

    python -m dit4dit_npu.train.grad_split --run RUN [--checkpoint step_N ...] [--batches 8] [--seed 0]
        [--json OUT.json]

Run it from the folder the run was trained in (a run's config names its data by the paths it was
given; data there that is not what a checkpoint was trained on is refused, and a missing demo
dataset is not generated). For each checkpoint the model is rebuilt from the run's ``config.yaml``
(its training mode, one pass or two, the action loss into the backbone or not), its weights are
loaded from the checkpoint's exported policy (with ``trainer.ema`` on: the EMA's weights, which
the policy holds, not the ones the optimizer stepped), and on ``--batches`` training batches
(drawn with ``--seed``: the same samples and noise at every checkpoint) the two losses' gradients
are taken apart with ``torch.autograd.grad``; nothing is updated. Per part of the model it prints
the norm of the action loss's gradient, the norm of the video loss's gradient times
``trainer.loss_scale.future_video`` (as the trainer weights it), their ratio and their cosine,
each the mean over the batches. A batch is one micro-batch of ``per_device_batch_size``: an
update's gradient (``gradient_accumulation_steps`` of them on every rank) is their mean: its norms
are no larger than these means of norms, and its cosine is not the mean of these cosines.

- ``action head``: only the action loss reaches it;
- ``embeddings`` (patch, time and text projections) and ``blocks 0..L`` (L = ``extract_layer``):
  the part both losses train when the action loss reaches the backbone
  (``backprop_action_to_backbone``, with one pass or two; one pass without it detaches the
  features as two passes do): where the two can pull against each other; ``shared`` is the two
  together;
- ``blocks L+1..`` and ``output layers``: the video loss only.

Why: at equal training time the joint objective has trailed the no-video one. If, in the shared
part, the video gradient is many times the action gradient and the two are near orthogonal (cosine
~0) or opposed (< 0), the video loss decides where the shared blocks go, and the action head's
features move under it at every step. ``trainer.video_loss_interval`` k > 1 applies the video
gradient on every k-th step only: its row is what such a step adds (the action gradient shown
is a video step's; with one pass the other steps' differs: their head reads the feature pass).

The gradients are taken in float32, without autocast, whatever ``trainer.mixed_precision`` the run
trained with. The run needs future frames in its clip (else it has no video loss).
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from dit4dit_npu.errors import DiT4DiTError

PARTS = ("action head", "embeddings", "blocks 0..L", "shared", "blocks L+1..", "output layers", "all")
_BLOCK = re.compile(r"^backbone\.transformer\.transformer_blocks\.(\d+)\.")
_OUTPUT = re.compile(r"^backbone\.transformer\.(norm_out|proj_out)\b")


class GradSplitError(DiT4DiTError, ValueError):
    """Bad grad_split arguments or run folder (one line, no traceback)."""


def part_of(name: str, extract_layer: int) -> str:
    """A trainable parameter's part (the head, the shared backbone, the video-only backbone)."""
    if name.startswith("action_model."):
        return "action head"
    m = _BLOCK.match(name)
    if m:
        return "blocks 0..L" if int(m.group(1)) <= extract_layer else "blocks L+1.."
    return "output layers" if _OUTPUT.match(name) else "embeddings"


def _in_part(part: str, p: str) -> bool:
    if part == "all":
        return True
    if part == "shared":
        return p in ("embeddings", "blocks 0..L")
    return p == part


@dataclass
class Row:
    part: str
    params: int
    action_norm: float
    video_norm: float  # of the weighted video loss's gradient
    cosine: float  # nan where either gradient is zero in this part

    @property
    def ratio(self) -> float:
        return self.video_norm / self.action_norm if self.action_norm > 0 else math.inf if self.video_norm > 0 else math.nan


def checkpoint_dirs(run: Path, names: list[str] | None) -> list[Path]:
    """The run's checkpoints with an exported policy (all, in step order, or the named ones)."""
    if not (run / "config.yaml").is_file():
        raise GradSplitError(f"--run {run}: no config.yaml there (expected a training run folder)")
    found = sorted((p for p in (run / "checkpoints").glob("step_*") if (p / "policy").is_dir()),
                   key=lambda p: int(p.name.split("_")[-1]) if p.name.split("_")[-1].isdigit() else -1)
    if names:
        by_name = {p.name: p for p in found}
        missing = [n for n in names if n not in by_name]
        if missing:
            raise GradSplitError(f"--checkpoint {missing[0]}: not a checkpoint with a policy in {run / 'checkpoints'} "
                                 f"(there: {', '.join(by_name) or 'none'})")
        return [by_name[n] for n in names]
    if not found:
        raise GradSplitError(f"--run {run}: no checkpoints/step_*/policy there")
    return found


def load_run(run: Path):
    """The run's config and its training data (built as the trainer builds them, one rank)."""
    from dit4dit_npu.config import load_config
    from dit4dit_npu.data import build_training_data
    from dit4dit_npu.weights import vae_identity

    # a demo dataset missing where the run's relative path points (another working folder) is
    # refused, never generated there: it need not be the data the run was trained on
    cfg = load_config(run / "config.yaml", ["datasets.vla_data.generate_demo_if_missing=false"])
    c = cfg.framework.cosmos25
    if c.training != "joint":
        raise GradSplitError(f"{run / 'config.yaml'}: framework.cosmos25.training is {c.training!r}, which trains "
                             "no video loss beside the action loss (expected 'joint')")
    if c.lora.enabled:
        raise GradSplitError(f"{run / 'config.yaml'}: a LoRA run (framework.cosmos25.lora); "
                             "grad_split loads full transformer weights only")
    d = cfg.datasets.vla_data
    data = build_training_data(cfg, vae_identity=vae_identity(cfg) if d.latent_cache else None)
    if data.io.spec.num_frames < 2:  # one frame is one latent frame: nothing for the video loss to predict
        raise GradSplitError(f"{run / 'config.yaml'}: clips of one frame (datasets.vla_data.video_delta_indices "
                             f"{d.video_delta_indices}) have no future frame, so the run has no video loss "
                             "(expected a clip with future frames)")
    return cfg, data


def check_trained_on(run: Path, ckpts: list[Path], data) -> None:
    """The data at the config's paths is what each checkpoint was trained on (its split and
    statistics): relative paths read from another working folder may find other data."""
    from dit4dit_npu.train.checkpoint_manager import data_fingerprint
    from dit4dit_npu.train.resume import data_change

    now = data_fingerprint(data)
    for ckpt in ckpts:
        what = data_change(ckpt, now)
        if what:
            raise GradSplitError(f"--run {run}: the data its config.yaml names (from {Path.cwd()}) is not what "
                                 f"{ckpt.name} was trained on: {what} (run it from the folder the run was trained in)")


def model_at(cfg, data, ckpt: Path):
    """The run's training model with ``ckpt``'s exported weights and prompt cache, frozen parts frozen."""
    from dit4dit_npu.policy.folder import load_policy_folder
    from dit4dit_npu.train.optim import freeze_modules
    from dit4dit_npu.weights import build_dit4dit

    loaded = load_policy_folder(ckpt / "policy")
    # float32 without autocast (the model's own autocast follows trainer.mixed_precision)
    fp32 = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, mixed_precision="no"))
    model = build_dit4dit(fp32, data.io.spec)
    model.load_trainable_state_dict(loaded.model.trainable_state_dict())
    model.set_prompt_cache(loaded.prompt_cache)
    freeze_modules(model, cfg.trainer.freeze_modules)
    return model.float().train()


def batches(data, count: int, batch_size: int, seed: int) -> list:
    """``count`` training batches of distinct samples, the same for a seed at every checkpoint."""
    from dit4dit_npu.batch import Batch

    ds = data.train_dataset
    n = count * batch_size
    if n > len(ds):
        raise GradSplitError(f"--batches {count}: {n} samples asked, the training split has {len(ds)}")
    idx = np.random.default_rng(seed).choice(len(ds), size=n, replace=False)
    return [Batch.collate([ds[int(i)] for i in idx[k * batch_size:(k + 1) * batch_size]]) for k in range(count)]


def _dots(a: torch.Tensor | None, v: torch.Tensor | None) -> tuple[float, float, float]:
    """|a|^2, |v|^2 and a.v of one parameter's two gradients (a missing gradient is zero)."""
    a = None if a is None else a.float()
    v = None if v is None else v.float()
    return (0.0 if a is None else float((a * a).sum()), 0.0 if v is None else float((v * v).sum()),
            0.0 if a is None or v is None else float((a * v).sum()))


def split(model, batch_list: list, video_weight: float, seed: int) -> tuple[list[Row], dict[str, float]]:
    """Per part: mean over batches of |g_action|, |w g_video| and their cosine; the mean losses."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]  # what the optimizer trains
    parts = [part_of(n, model.backbone.cfg.extract_layer) for n, _ in named]
    params = [p for _, p in named]
    acc = {part: np.zeros(4) for part in PARTS}  # sum |a|, sum |v|, sum cos, count of defined cos
    losses = np.zeros(2)
    for k, batch in enumerate(batch_list):
        torch.manual_seed(seed * 1_000_003 + k)  # the noise the model draws: the same at every checkpoint
        out = model(batch)
        action, video = out["action_loss"], video_weight * out["video_loss"]
        losses += (float(out["action_loss"].detach()), float(out["video_loss"].detach()))
        ga = torch.autograd.grad(action, params, retain_graph=True, allow_unused=True)
        gv = torch.autograd.grad(video, params, allow_unused=True) if video.requires_grad else [None] * len(params)
        dots = [_dots(a, v) for a, v in zip(ga, gv)]  # once per parameter, then summed per part
        for part in PARTS:
            aa, vv, av = (sum(d[i] for d, where in zip(dots, parts) if _in_part(part, where)) for i in range(3))
            acc[part][:2] += (math.sqrt(aa), math.sqrt(vv))
            if aa > 0 and vv > 0:
                acc[part][2:] += (av / math.sqrt(aa * vv), 1)
    n = len(batch_list)
    rows = []
    for part in PARTS:
        a, v, c, m = acc[part]
        size = sum(p.numel() for p, where in zip(params, parts) if _in_part(part, where))
        rows.append(Row(part, size, a / n, v / n, c / m if m else math.nan))
    return rows, {"action_loss": losses[0] / n, "video_loss": losses[1] / n}


def format_rows(rows: list[Row]) -> list[str]:
    def num(x: float) -> str:
        return "-" if math.isnan(x) else "inf" if math.isinf(x) else f"{x:.3g}"

    out = ["| part | params | action grad norm | weighted video grad norm | video / action | cosine |",
           "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        if r.params:
            out.append(f"| {r.part} | {r.params} | {num(r.action_norm)} | {num(r.video_norm)} | {num(r.ratio)} "
                       f"| {'-' if math.isnan(r.cosine) else f'{r.cosine:+.3f}'} |")
    return out


def _finite_or_none(row: dict) -> dict:
    """JSON has no nan or inf: an undefined cosine or ratio is null."""
    return {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in row.items()}


def header(run: Path, cfg, count: int, seed: int) -> str:
    """What the rows below are of: the run's settings that decide where each gradient goes."""
    c, t = cfg.framework.cosmos25, cfg.trainer
    k = t.video_loss_interval
    # one pass without backprop_action_to_backbone detaches the head's features too (DiT4DiT.forward)
    return (f"{run}: extract_layer L={c.extract_layer}, one pass {c.one_pass.enabled}, action loss into the backbone "
            f"{c.backprop_action_to_backbone}, video weight {t.loss_scale.future_video}"
            + (f", the video loss on every {k}-th step" if k > 1 else "")
            + (f", the video loss within trainer.video_loss_span={t.video_loss_span}" if t.video_loss_span != [0.0, 1.0]
               else "")
            + (f"; the EMA's weights (trainer.ema.decay={t.ema.decay}), as the policy holds them" if t.ema.decay
               is not None else "")
            + f"; {count} batches of {cfg.datasets.vla_data.per_device_batch_size}, seed {seed}")


def run_split(run: Path, names: list[str] | None, count: int, seed: int) -> list[dict]:
    """Every asked checkpoint's rows (printed as they come) -> the JSON records."""
    ckpts = checkpoint_dirs(run, names)
    cfg, data = load_run(run)
    check_trained_on(run, ckpts, data)
    batch_list = batches(data, count, cfg.datasets.vla_data.per_device_batch_size, seed)
    print(header(run, cfg, count, seed), flush=True)
    w = cfg.trainer.loss_scale.future_video
    records = []
    for ckpt in ckpts:
        rows, losses = split(model_at(cfg, data, ckpt), batch_list, w, seed)
        print(f"\n{ckpt.name}: action loss {losses['action_loss']:.4f}, video loss {losses['video_loss']:.4f}")
        print("\n".join(format_rows(rows)), flush=True)
        records.append({"checkpoint": ckpt.name, **losses, "rows": [_finite_or_none({**r.__dict__, "ratio": r.ratio})
                                                                     for r in rows]})
    return records


if __name__ == "__main__":  # python -m dit4dit_npu.train.grad_split: the command is train/ops_cli.py's
    from dit4dit_npu.train.ops_cli import grad_split_main

    raise SystemExit(grad_split_main())
