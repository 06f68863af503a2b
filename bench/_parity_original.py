"""The original-DiT4DiT side of ``bench/parity_dit4dit.py`` (run by it, in the original's venv).

    ORIGINAL_PYTHON bench/_parity_original.py --original-root DIR --base TINY_DIR --out OUT --preset libero

Runs the original code itself, unchanged, imported from ``--original-root`` (never copied here),
on a tiny random Cosmos-Predict2.5 folder, CPU fp32, and writes what the comparison needs:

- ``OUT/run/``: exactly what its trainer writes: ``checkpoints/steps_1000_pytorch_model.pt``
  (``torch.save(model.state_dict())``), ``config.yaml`` (its access-tracked config) and
  ``dataset_statistics.json`` (its schema);
- ``observation.npz``: a robot observation (per-view uint8 frames, state in the robot's order)
  and what the original returned for it: ``normalized`` (its server's reply) and ``actions``
  (after its client's un-normalization: the LIBERO client's own code through the server's
  routing and the msgpack wire format; RoboTwin has no client, so its clients' clip to [-1, 1]
  and its dataset transform's inverse), in the robot's order;
- ``batch.npz``: a training batch as its dataloader emits it and the losses of one forward;
- ``noise_{predict,train}.npz``: every random draw of both calls, by name, in call order
  (recorded by wrapping torch's sampling functions; with the action head in eval mode these
  are all of its randomness).

The harness-level settings the original needs on tiny weights: a "DiT-T" entry in its head-size
table, fp32, and the launch scripts' flags. The tiny folder is this project's tiny recipe
(``dit4dit_npu.models.tiny``), written by the original's library versions so both can read it.
"""

from __future__ import annotations

import argparse
import copy
import importlib.machinery
import json
import os
import sys
import types
from pathlib import Path

import numpy as np
import torch

PRESETS = {
    # LIBERO: primary | wrist, 9 delta frames every 2nd -> 5 frames; action 7 (gripper raw) padded
    # to 8; state 8 -> interleaved sin/cos 16; chunk 8.
    "libero": dict(views=2, hw=(32, 32), vdi=list(range(9)), ratio=2, A=8, S=16, a_real=7, s_raw=8, fws=7,
                   tag="franka", prompts=["pick up the black bowl and place it on the plate",
                                          "open the top drawer of the cabinet"]),
    # RoboTwin: 3 cameras, 14-d [L6, R6, Lg, Rg] in DiT4DiT's order, joints min-max, grippers
    # binary; 16 loaded action steps, so fws 15 (it slices the last fws + 1); 8 frames.
    "robotwin": dict(views=3, hw=(32, 32), vdi=list(range(8)), ratio=1, A=14, S=14, a_real=14, s_raw=14, fws=15,
                     tag="new_embodiment", prompts=["lift the pot with both arms", "stack the blocks, hand over the cup"]),
}
ROBOTWIN_ORDER = [0, 1, 2, 3, 4, 5, 7, 8, 9, 10, 11, 12, 6, 13]  # model = robot[ORDER]
TINY_DIT = {"input_embedding_dim": 64, "attention_head_dim": 32, "num_attention_heads": 2}
EXTRACT_LAYER, B, R = 2, 2, 4


class NoiseTape:
    """Records every draw of torch.randn / randn_like / rand / rand_like / Beta.sample."""

    NAMES = ("randn", "randn_like", "rand", "rand_like")

    def __init__(self) -> None:
        self.draws: list[torch.Tensor] = []

    def __enter__(self) -> NoiseTape:
        from torch.distributions import Beta

        self.saved = {n: getattr(torch, n) for n in self.NAMES} | {"beta": Beta.sample}
        for n in self.NAMES:
            setattr(torch, n, self._wrap(self.saved[n]))
        Beta.sample = self._wrap(self.saved["beta"])
        return self

    def _wrap(self, fn):
        def draw(*args, **kwargs):
            out = fn(*args, **kwargs)
            self.draws.append(out.detach().clone())
            return out
        return draw

    def __exit__(self, *exc) -> None:
        from torch.distributions import Beta

        for n in self.NAMES:
            setattr(torch, n, self.saved[n])
        Beta.sample = self.saved["beta"]

    def named(self, names: list[str]) -> dict[str, np.ndarray]:
        if len(names) != len(self.draws):
            raise RuntimeError(f"expected draws {names}, got {[tuple(d.shape) for d in self.draws]}")
        return {n: d.float().numpy() for n, d in zip(names, self.draws)}


def write_tiny_base(path: Path) -> None:
    from dit4dit_npu.config import TinyCosmosConfig
    from dit4dit_npu.weights.tiny_cache import write_tiny_base_model

    write_tiny_base_model(TinyCosmosConfig(), path)


def original_config(root: Path, base: Path, p: dict, run: Path):
    from omegaconf import OmegaConf

    cfg = OmegaConf.load(root / "DiT4DiT/config/libero/dit4dit_libero.yaml")
    dots = [  # run_libero.sh's flags, sized for the tiny model
        "framework.name=DiT4DiT", f"framework.cosmos25.base_model={base}",
        "framework.action_model.action_model_type=DiT-T", "datasets.vla_data.per_device_batch_size=2",
        "trainer.freeze_modules=backbone_interface.extractor.text_encoder,backbone_interface.extractor.vae",
        f"framework.cosmos25.extract_layer={EXTRACT_LAYER}", "framework.cosmos25.flow_matching.time_distribution=uniform",
        "framework.cosmos25.flow_matching.high_sigma_ratio=null", "framework.cosmos25.flow_matching.high_sigma_min=null",
        f"datasets.vla_data.action_video_freq_ratio={p['ratio']}", f"run_root_dir={run.parent}", f"run_id={run.name}",
        "framework.cosmos25.torch_dtype=float32", "framework.cosmos25.vl_hidden_dim=32",
        "framework.action_model.diffusion_model_cfg.cross_attention_dim=32",
        "framework.action_model.diffusion_model_cfg.num_layers=4", "framework.action_model.diffusion_model_cfg.output_dim=64",
        # stated in its config (merged over the table entry, as it does), so the import reads them
        f"framework.action_model.diffusion_model_cfg.num_attention_heads={TINY_DIT['num_attention_heads']}",
        f"framework.action_model.diffusion_model_cfg.attention_head_dim={TINY_DIT['attention_head_dim']}",
        "framework.action_model.hidden_size=96", f"framework.action_model.action_dim={p['A']}",
        # the original's own key (it knows no chunk_length; our import converts this one)
        f"framework.action_model.state_dim={p['S']}", f"framework.action_model.future_action_window_size={p['fws']}",
        f"framework.action_model.action_horizon={p['fws'] + 1}", f"datasets.vla_data.max_action_dim={p['A']}",
        f"datasets.vla_data.max_state_dim={p['S']}",
    ]
    cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist(dots))
    cfg.datasets.vla_data.video_delta_indices = p["vdi"]
    cfg.output_dir = str(run)
    return cfg


def statistics(p: dict, rng: np.random.Generator) -> dict:
    """In the schema of its save_dataset_statistics; one degenerate dim (min == max) on purpose."""
    if p["tag"] == "franka":
        lo, hi = np.r_[rng.uniform(-1, -0.3, 6), 0.0], np.r_[rng.uniform(0.3, 1, 6), 1.0]
        lo[4] = hi[4] = 0.25
        mask, slo, shi = [True] * 6 + [False], rng.uniform(-2, -0.5, 8), rng.uniform(0.5, 2, 8)
    else:
        lo, hi = np.r_[rng.uniform(-2, -0.5, 12), 0.0, 0.0], np.r_[rng.uniform(0.5, 2, 12), 1.0, 1.0]
        lo[3] = hi[3] = 0.1
        mask, slo, shi = [True] * 12 + [False, False], lo.copy(), hi.copy()

    def block(a, b):
        return dict(mean=((a + b) / 2).tolist(), std=((b - a) / 4).tolist(), max=b.tolist(), min=a.tolist(),
                    q01=(a + 0.01 * (b - a)).tolist(), q99=(b - 0.01 * (b - a)).tolist())

    return {p["tag"]: dict(action=block(lo, hi) | {"mask": mask}, state=block(slo, shi), num_transitions=1000,
                           num_trajectories=10)}


def model_state(p: dict, stats: dict, raw_state: np.ndarray, normalizer) -> np.ndarray:
    """The state the model takes, by the original's own transforms (float64, as a client would)."""
    if p["tag"] == "franka":  # its LIBERO client: float32 [sin s0, cos s0, sin s1, ...]
        s = raw_state.astype(np.float32)
        return np.stack([np.sin(s), np.cos(s)], -1).reshape(len(s), -1)
    st = stats[p["tag"]]["state"]
    x = torch.from_numpy(raw_state)
    joints = normalizer("min_max", {"min": st["min"][:12], "max": st["max"][:12]}).forward(x[:, :12])
    grippers = normalizer("binary", {}).forward(x[:, 12:])
    return torch.cat([joints, grippers], -1).numpy().astype(np.float32)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--original-root", type=Path, required=True)
    ap.add_argument("--base", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--preset", choices=sorted(PRESETS), required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    if not (args.base / "model_index.json").is_file():
        write_tiny_base(args.base)
    root, out, p = args.original_root.resolve(), args.out.resolve(), PRESETS[args.preset]
    # The original is a checkout, not a package: import it from its root, run from there (it
    # resolves some paths relative to it). pytorch3d (imported, unused by these robot types)
    # cannot be installed here: an empty module stands in.
    sys.path.insert(0, str(root))
    os.chdir(root)
    for name in ("pytorch3d", "pytorch3d.transforms"):
        sys.modules.setdefault(name, types.ModuleType(name))
        sys.modules[name].__spec__ = importlib.machinery.ModuleSpec(name, loader=None)
    from DiT4DiT.dataloader.gr00t_lerobot.transform.state_action import Normalizer
    from DiT4DiT.model.framework import build_framework
    from DiT4DiT.model.modules.action_model import ActionDiT
    from DiT4DiT.training.trainer_utils.config_tracker import wrap_config
    from DiT4DiT.training.trainer_utils.trainer_tools import TrainerUtils, build_param_lr_groups

    run = out / "run"
    cfg = wrap_config(original_config(root, args.base.resolve(), p, run))
    ActionDiT.DiTConfig["DiT-T"] = dict(TINY_DIT)
    torch.manual_seed(0)
    model = build_framework(cfg)
    # a key the original does not read would leave its default chunk (and fail only later, in
    # predict_action, on the noise's shape): its head must take the preset's chunk
    if model.future_action_window_size != p["fws"] or model.action_model.action_horizon != p["fws"] + 1:
        sys.exit(f"the original built a chunk of {model.action_model.action_horizon} steps (future_action_window_size "
                 f"{model.future_action_window_size}), preset {args.preset} needs {p['fws'] + 1}")
    build_param_lr_groups(model=model, cfg=cfg)  # what its trainer does before training
    TrainerUtils.freeze_backbones(model, freeze_modules=cfg.trainer.freeze_modules)
    model.eval()  # its server's mode; the loss below is with the head in eval mode too (no dropout)

    rng = np.random.default_rng(1)
    stats = statistics(p, rng)
    st = stats[p["tag"]]
    T = len(p["vdi"][:: p["ratio"]])
    frames = rng.integers(0, 256, size=(B, T, p["views"], *p["hw"], 3), dtype=np.uint8)
    raw_state = rng.uniform(st["state"]["min"], st["state"]["max"], size=(B, p["s_raw"]))
    chunk = p["fws"] + 1
    raw_act = rng.uniform(st["action"]["min"], st["action"]["max"], size=(B, chunk, p["a_real"]))
    grip = ~np.array(st["action"]["mask"])
    raw_act[..., grip] = rng.integers(0, 2, size=raw_act[..., grip].shape)
    if p["tag"] != "franka":
        raw_state[:, 12:] = rng.integers(0, 2, size=(B, 2))
    prompts = p["prompts"]

    # ---- predict_action on the observation, as its server receives it
    state = model_state(p, stats, raw_state, Normalizer)
    state = np.pad(state, ((0, 0), (0, p["S"] - state.shape[1])))[:, None]
    examples = [dict(image=[np.concatenate(list(frames[b, 0]), axis=1)], lang=prompts[b], state=state[b]) for b in range(B)]
    torch.manual_seed(2)
    with torch.no_grad(), NoiseTape() as tape:
        normalized = model.predict_action(examples=copy.deepcopy(examples))["normalized_actions"]
    noise_predict = tape.named([f"condition_{b}" for b in range(B)] + ["feature", "action"])

    # ---- the run folder, as its trainer writes it
    (run / "checkpoints").mkdir(parents=True, exist_ok=True)
    ckpt = run / "checkpoints" / "steps_1000_pytorch_model.pt"
    torch.save(model.state_dict(), ckpt)
    cfg.save_accessed_config(run / "config.yaml", use_original_values=False)
    (run / "dataset_statistics.json").write_text(json.dumps(stats, indent=2))

    # ---- its client's un-normalization
    if p["tag"] == "franka":
        actions = libero_client(model, ckpt, frames, raw_state, prompts, noise_predict, chunk)
    else:
        # as its clients un-normalize: every dim clipped to [-1, 1] first, then its dataset's inverse
        a = torch.from_numpy(np.clip(normalized.astype(np.float64), -1, 1))
        joints = Normalizer("min_max", {"min": st["action"]["min"][:12], "max": st["action"]["max"][:12]}).inverse(a[..., :12])
        model_order = torch.cat([joints, Normalizer("binary", {}).inverse(a[..., 12:])], -1).numpy()
        actions = model_order[..., np.argsort(ROBOTWIN_ORDER)]
        raw_state = raw_state[:, np.argsort(ROBOTWIN_ORDER)]  # the robot's order
    np.savez(out / "observation.npz", frames=frames[:, 0], state=raw_state, normalized=normalized, actions=actions,
             model_state=state)  # the state its server received (for the export check's reload)
    (out / "prompts.json").write_text(json.dumps(prompts))

    # ---- one training forward on a batch as its dataloader emits it (float16 state/actions)
    a_model = raw_act.copy()
    lo, hi = np.asarray(st["action"]["min"]), np.asarray(st["action"]["max"])
    for d in np.flatnonzero(~grip):
        a_model[..., d] = Normalizer("min_max", {"min": [lo[d]], "max": [hi[d]]}).forward(torch.from_numpy(raw_act[..., d : d + 1]))[..., 0].numpy()
    if p["tag"] != "franka":
        a_model[..., grip] = (raw_act[..., grip] > 0.5).astype(np.float64)
    act16 = np.zeros((B, chunk, p["A"]), np.float16)
    act16[..., : p["a_real"]] = a_model
    mask = np.zeros_like(act16, dtype=bool)
    mask[..., : p["a_real"]] = True
    tiled = np.concatenate(list(np.moveaxis(frames, 2, 0)), axis=-2).transpose(0, 1, 4, 2, 3)  # B,T,3,H,V*W
    images = np.ascontiguousarray(tiled).astype(np.float32) / 255.0  # its dataloader: [0, 1] floats
    state16 = state.astype(np.float16)
    batch = [dict(image=[torch.from_numpy(images[b, t]) for t in range(T)], lang=prompts[b], action=act16[b],
                  state=state16[b], action_mask=mask[b]) for b in range(B)]
    torch.manual_seed(3)
    with torch.enable_grad(), NoiseTape() as tape:
        losses = {k: float(v) for k, v in model.forward(batch).items()}
    noise_train = tape.named([f"condition_{b}" for b in range(B)]
                             + ["feature", "video_time", "video", "video_fill", "action", "action_beta"])
    np.savez(out / "batch.npz", frames=tiled, state=state16[:, 0], action=act16, mask=mask,
             action_loss=losses["action_loss"], video_loss=losses["future_video_loss"])
    np.savez(out / "noise_predict.npz", **noise_predict)
    np.savez(out / "noise_train.npz", **noise_train)
    print(json.dumps({"preset": args.preset, **losses}))


def libero_client(model, ckpt: Path, frames, raw_state, prompts, noise: dict, chunk: int) -> np.ndarray:
    """Its LIBERO client's ``step`` per sample, against its server's routing through msgpack
    (no socket), replaying the sample's recorded noise."""
    import examples.LIBERO.eval_files.model2libero_interface as client_module
    from deployment.model_server.tools import msgpack_numpy as mp
    from deployment.model_server.tools.websocket_policy_server import WebsocketPolicyServer

    server = WebsocketPolicyServer(policy=model, metadata={"env": "simpler_env"})

    class Loopback:
        def __init__(self, host, port):
            pass

        def get_server_metadata(self):
            return mp.unpackb(mp.Packer().pack(server._metadata))

        def predict_action(self, query):
            reply = server._route_message(mp.unpackb(mp.Packer().pack(query)))
            return mp.unpackb(mp.Packer().pack(reply))

    client_module.WebsocketClientPolicy = Loopback
    out = []
    for b in range(len(prompts)):
        tape = [torch.from_numpy(noise[f"condition_{b}"]), torch.from_numpy(noise["feature"][b : b + 1]),
                torch.from_numpy(noise["action"][b : b + 1])]
        saved = torch.randn
        torch.randn = lambda *a, _tape=tape, **k: _tape.pop(0).clone()  # replay its 3 draws, in order
        try:
            client = client_module.ModelClient(policy_ckpt_path=str(ckpt), image_size=list(frames.shape[-2:-4:-1]))
            steps = []
            for step in range(chunk):
                ex = dict(image=frames[b, 0, 0].copy(), wrist_image=frames[b, 0, 1].copy(), state=raw_state[b].copy(),
                          lang=prompts[b])
                raw = client.step(example=ex, step=step)["raw_action"]
                steps.append(np.concatenate([raw["world_vector"], raw["rotation_delta"], raw["open_gripper"]]))
        finally:
            torch.randn = saved
        out.append(np.stack(steps))
    return np.stack(out)


if __name__ == "__main__":
    main()
