"""The original-DiT4DiT side of ``bench/profile_medium.py`` (started by it, in the original's venv).

    ORIGINAL_PYTHON bench/_profile_original.py --original-root DIR --base DIR --spec JSON

A long-lived worker: builds the original model, unchanged, imported from ``--original-root``
(never copied here), on a random Cosmos folder of ``--spec``'s sizes (this project's tiny recipe,
written by the original's library versions), CPU fp32, then answers one JSON command per stdin
line with one JSON line on stdout (after ``REPLY``), so the caller can interleave its own rounds with these:

- ``{"cmd": "train", "batch": B, "flops": false, "staged": true}``: one training step as its trainer does it
  (``model.forward`` -> backward -> ``clip_grad_norm_`` -> AdamW built by ``build_param_lr_groups``),
  staged (unless ``"staged": false``), then one unstaged step of the same; seconds per stage (FLOPs
  per stage with ``"flops"``) and of the unstaged step (``"plain"``);
- ``{"cmd": "predict", "flops": false, "staged": true}``: the same for one ``predict_action`` at batch 1 end to end: native
  uint8 frames per camera, raw state and instruction in, robot-unit actions out, with the client
  side the original's LIBERO client does (its ``ModelClient._resize_image``: cv2 INTER_AREA per
  view to the training size, views side by side), RoboTwin's state/action transforms (its
  ``Normalizer`` min-max / binary, actions clipped to [-1, 1] first as its clients do); no socket.

Staging does not change its calls: forward hooks on its own submodules (text encoder, VAE
encoder, transformer, action head) mark where each phase starts, and the time between two marks
belongs to the phase the first one opens (so the phases add up to the whole call; its glue lands in
the phase it runs in). The two backwards (action head, video) are called apart: the feature pass's
output is detached in its forward, so the two graphs are disjoint and the work is the same as its
one backward of the sum. FLOPs: one FlopCounterMode per phase, switched at the same marks.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import json
import os
import sys
import time
import types
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
from _parity_original import ROBOTWIN_ORDER, original_config
from torch.utils.flop_counter import FlopCounterMode

REPLY = "@profile@ "  # marks its reply lines: the original prints its own lines to stdout too
TRAIN_PHASES = ("input build + tokenize", "prompt embeddings", "condition encode (per sample)", "feature pass",
                "VAE encode", "video flow-matching fwd", "action head fwd")


class Marks:
    """Phase name -> seconds (and FLOPs) of one call, phases opened by ``open``."""

    def __init__(self, flops: bool) -> None:
        self.t: dict[str, float] = {}
        self.f: dict[str, float] = {}
        self.flops, self.name, self.fc = flops, None, None

    def open(self, name: str) -> None:
        now = time.perf_counter()
        self._close(now)
        self.name, self.t0 = name, now
        if self.flops:
            self.fc = FlopCounterMode(display=False)
            self.fc.__enter__()

    def _close(self, now: float) -> None:
        if self.name is None:
            return
        self.t[self.name] = self.t.get(self.name, 0.0) + now - self.t0
        if self.fc is not None:
            self.fc.__exit__(None, None, None)
            self.f[self.name] = self.f.get(self.name, 0.0) + self.fc.get_total_flops()
            self.fc = None
        self.name = None

    def close(self) -> None:
        self._close(time.perf_counter())


class Profiler:
    def __init__(self, model, opt, clip: float, scale: float, stats: dict, spec: dict, resize) -> None:
        self.model, self.opt, self.clip, self.scale, self.stats, self.spec = model, opt, clip, scale, stats, spec
        self.resize, self.marks = resize, None
        ext = model.backbone_interface.extractor
        self.calls = {"transformer": 0, "vae": 0}
        hooks = [(ext.text_encoder, self._text), (ext.vae.encoder, self._vae), (ext.transformer, self._transformer),
                 (model.action_model, self._action), (model.action_model.model, self._sampling)]
        for module, fn in hooks:
            module.register_forward_pre_hook(lambda m, a, fn=fn: fn("pre"))
            module.register_forward_hook(lambda m, a, o, fn=fn: fn("post"))

    # ---- the marks: which phase each of its own calls opens
    def _text(self, when: str) -> None:
        if self.marks and when == "pre":
            self.marks.open("prompt embeddings")

    def _vae(self, when: str) -> None:
        if self.marks and when == "pre" and self.marks.name == "prompt embeddings":
            self.marks.open("condition encode (per sample)" if self.training else "VAE encode")

    def _transformer(self, when: str) -> None:
        if not self.marks:
            return
        if when == "pre":
            self.calls["transformer"] += 1
            if self.calls["transformer"] == 1:
                self.marks.open("feature pass")
            else:
                self.marks.open("video flow-matching fwd")
        elif self.calls["transformer"] == 1 and self.training:
            self.marks.open("VAE encode")

    def _action(self, when: str) -> None:
        if self.marks and when == "pre" and self.training:
            self.marks.open("action head fwd")

    def _sampling(self, when: str) -> None:
        if self.marks and when == "pre" and not self.training and self.marks.name != "action sampling":
            self.marks.open("action sampling")

    # ---- training
    def batch(self, b: int, rng: np.random.Generator) -> list[dict]:
        s = self.spec
        T, (h, w), v, chunk, A = s["frames"], s["hw"], s["views"], s["chunk"], s["action_dim"]
        out = []
        for _ in range(b):
            images = rng.random((T, 3, h, v * w), dtype=np.float32)  # its dataloader: [0, 1] floats, views tiled
            out.append(dict(image=[torch.from_numpy(images[t]) for t in range(T)], lang=s["instruction"],
                            action=rng.uniform(-1, 1, (chunk, A)).astype(np.float16),
                            state=rng.uniform(-1, 1, (1, s["state_dim"])).astype(np.float16),
                            action_mask=np.ones((chunk, A), bool)))
        return out

    def train_step(self, batch: list[dict], flops: bool) -> dict:
        self.training, self.calls["transformer"] = True, 0
        m = self.marks = Marks(flops)
        m.open("input build + tokenize")
        with torch.enable_grad():
            out = self.model.forward(batch)
            m.open("action head bwd")
            out["action_loss"].backward()
            m.open("video flow-matching bwd")
            (out["future_video_loss"] * self.scale).backward()
        m.open("optimizer step")
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        m.close()
        self.marks = None
        return dict(times=m.t, flops=m.f)

    def plain_step(self, batch: list[dict]) -> float:
        t0 = time.perf_counter()
        with torch.enable_grad():
            out = self.model.forward(batch)
            (out["action_loss"] + out["future_video_loss"] * self.scale).backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return time.perf_counter() - t0

    # ---- predict_action end to end
    def predict(self, obs: dict, marks: Marks | None, normalizer) -> np.ndarray:
        self.training, self.calls["transformer"] = False, 0
        self.marks = marks
        if marks:
            marks.open("client transforms")
        st = self.stats["state"]
        views = [self.resize(SimpleNamespace(image_size=list(self.spec["hw"][::-1])), obs[k]) for k in self.spec["cameras"]]
        x = torch.from_numpy(obs["state"][ROBOTWIN_ORDER].astype(np.float64))[None]  # its model order
        state = torch.cat([normalizer("min_max", {"min": st["min"][:12], "max": st["max"][:12]}).forward(x[:, :12]),
                           normalizer("binary", {}).forward(x[:, 12:])], -1).numpy().astype(np.float32)
        example = dict(image=[np.concatenate(views, axis=1)], lang=obs["instruction"], state=state)
        if marks:
            marks.open("input build + tokenize")
        normalized = self.model.predict_action(examples=[example])["normalized_actions"][0]
        if marks:
            marks.open("unnormalize")
        a = torch.from_numpy(np.clip(normalized.astype(np.float64), -1, 1))
        sa = self.stats["action"]
        joints = normalizer("min_max", {"min": sa["min"][:12], "max": sa["max"][:12]}).inverse(a[..., :12])
        actions = torch.cat([joints, normalizer("binary", {}).inverse(a[..., 12:])], -1).numpy()[..., np.argsort(ROBOTWIN_ORDER)]
        if marks:
            marks.close()
        self.marks = None
        return actions


def build(root: Path, base: Path, spec: dict):
    from DiT4DiT.model.framework import build_framework
    from DiT4DiT.model.modules.action_model import ActionDiT
    from DiT4DiT.training.trainer_utils.config_tracker import wrap_config
    from DiT4DiT.training.trainer_utils.trainer_tools import TrainerUtils, build_param_lr_groups
    from omegaconf import OmegaConf

    s, chunk = spec, spec["chunk"]
    p = dict(vdi=list(range(s["frames"])), ratio=1, A=s["action_dim"], S=s["state_dim"], fws=chunk - 1)
    cfg = original_config(root, base, p, Path(os.environ.get("TMPDIR", "/tmp")) / "profile_original_run")
    cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist([  # bench/medium.yaml's sizes, in its keys
        f"framework.cosmos25.extract_layer={s['extract_layer']}", f"framework.cosmos25.max_sequence_length={s['max_seq']}",
        f"framework.cosmos25.vl_hidden_dim={s['hidden']}", f"framework.action_model.diffusion_model_cfg.cross_attention_dim={s['hidden']}",
        f"framework.action_model.diffusion_model_cfg.num_layers={s['head_layers']}",
        f"framework.action_model.diffusion_model_cfg.output_dim={s['head_output_dim']}",
        f"framework.action_model.diffusion_model_cfg.num_attention_heads={s['head_dims'][1]}",
        f"framework.action_model.diffusion_model_cfg.attention_head_dim={s['head_dims'][2]}",
        f"framework.action_model.hidden_size={s['head_hidden']}", f"trainer.repeated_diffusion_steps={s['repeats']}",
        f"datasets.vla_data.image_size=[{s['hw'][0]},{s['hw'][1]}]",
    ]))
    cfg = wrap_config(cfg)
    ActionDiT.DiTConfig["DiT-T"] = dict(zip(("input_embedding_dim", "num_attention_heads", "attention_head_dim"), s["head_dims"]))
    torch.manual_seed(0)
    model = build_framework(cfg)
    t = cfg.trainer
    opt = torch.optim.AdamW(build_param_lr_groups(model=model, cfg=cfg), lr=t.learning_rate.base,
                            betas=tuple(t.optimizer.betas), weight_decay=t.optimizer.weight_decay, eps=t.optimizer.eps)
    model = TrainerUtils.freeze_backbones(model, freeze_modules=t.freeze_modules)
    scale = float(getattr(getattr(t, "loss_scale", None), "future_video", 1.0))
    return model, opt, float(t.gradient_clipping), scale


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--original-root", type=Path, required=True)
    ap.add_argument("--base", type=Path, required=True)
    ap.add_argument("--spec", required=True, help="JSON: the sizes (see bench/profile_medium.py original_spec)")
    args = ap.parse_args()
    spec = json.loads(args.spec)
    torch.set_num_threads(int(spec.get("threads", 1)))
    if not (args.base / "model_index.json").is_file():
        from dit4dit_npu.config import TinyCosmosConfig
        from dit4dit_npu.weights.tiny_cache import write_tiny_base_model

        write_tiny_base_model(TinyCosmosConfig(**spec["tiny"]), args.base)
    root = args.original_root.resolve()
    sys.path.insert(0, str(root))  # a checkout, not a package (as the parity bench)
    os.chdir(root)
    for name in ("pytorch3d", "pytorch3d.transforms"):  # imported, unused by these robot types (as the parity bench)
        sys.modules.setdefault(name, types.ModuleType(name))
        sys.modules[name].__spec__ = importlib.machinery.ModuleSpec(name, loader=None)
    import examples.LIBERO.eval_files.model2libero_interface as client
    from DiT4DiT.dataloader.gr00t_lerobot.transform.state_action import Normalizer

    model, opt, clip, scale = build(root, args.base.resolve(), spec)
    rng = np.random.default_rng(0)
    lo, hi = rng.uniform(-2, -0.5, 14), rng.uniform(0.5, 2, 14)
    stats = {k: dict(min=lo.tolist(), max=hi.tolist()) for k in ("state", "action")}
    prof = Profiler(model, opt, clip, scale, stats, spec, client.ModelClient._resize_image)
    obs = {k: rng.integers(0, 256, (*spec["native"], 3), dtype=np.uint8) for k in spec["cameras"]}
    obs |= dict(state=rng.uniform(lo, hi).astype(np.float32), instruction=spec["instruction"])
    batches: dict[int, list[dict]] = {}
    print(REPLY + json.dumps({"ready": True, "trainable": sum(q.numel() for q in model.parameters() if q.requires_grad)}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["cmd"] == "quit":
            break
        if cmd["cmd"] == "train":
            b = batches.setdefault(cmd["batch"], prof.batch(cmd["batch"], rng))
            model.action_model.train()  # as after its build: the trainer never calls .train()
            r = prof.train_step(b, cmd.get("flops", False)) if cmd.get("staged", True) else {}
            r["plain"] = prof.plain_step(b)
        else:
            model.eval()  # its server's mode
            r = {}
            if cmd.get("staged", True):
                m = Marks(cmd.get("flops", False))
                prof.predict(obs, m, Normalizer)
                r = dict(times=m.t, flops=m.f)
            t0 = time.perf_counter()
            prof.predict(obs, None, Normalizer)
            r["plain"] = time.perf_counter() - t0
        print(REPLY + json.dumps(r), flush=True)


if __name__ == "__main__":
    main()
