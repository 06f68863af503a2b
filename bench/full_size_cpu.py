"""The real model at its real size, end to end on a CPU host (bash bench/full_size.sh --cpu).

    python bench/full_size_cpu.py --base DIR [--size full|medium] [--work DIR] [--stages a,b,...]
    python bench/full_size_cpu.py --smoke          # tiny sizes, every stage, minutes: checks the pipeline

Every stage is a fresh process (its peak RSS is its own, read with wait4), through the commands
users run: the base folder (dit4dit-make-base, skipped when DIR exists), a demo dataset, the prompt
cache built by the folder's text encoder (then released), training steps of the real RoboTwin config
(its objective, bf16 autocast, gradient checkpointing): full depth with the backbone frozen
(``training: action``, which also exports the policy the later stages use) and with LoRA; the full
objective with AdamW at --adamw-layers blocks (batch 1 and 2), then 2 ranks with DeepSpeed ZeRO-2;
predict_action through DiT4DiTPolicy (bf16 backbone, and fp32); the policy folder's content check
at load (default and full); the server with one dit4dit_client round trip; the export to the
original's run format (to-dit4dit) with its keys and shapes checked against our model tree.
Each training stage prints the memory planner's prediction for its config beside the measurement.
The table at the end has one row per stage; its last line is ``speedup: X.XX`` = the largest
planned / measured training peak (how well the plan predicts; 1.00 = exact).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REAL = ROOT / "configs/robotwin/dit4dit_robotwin.yaml"
STAGES = ("base", "data", "prompts", "train-action", "train-lora", "train-adamw-b1", "train-adamw-b2", "train-zero2",
          "predict-bf16", "predict-fp32", "check", "serve", "convert")


def args_of(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base", type=Path, default=ROOT / "fullsize_base", help="the base folder (written when absent)")
    p.add_argument("--size", choices=("full", "medium", "tiny"), default="full", help="size of a base folder to write")
    p.add_argument("--work", type=Path, default=ROOT / "full_size_cpu", help="data, runs, policy, logs")
    p.add_argument("--stages", default=",".join(STAGES), help=f"comma-separated subset of {','.join(STAGES)}")
    p.add_argument("--adamw-layers", type=int, default=4, help="transformer blocks of the AdamW / ZeRO-2 stages")
    p.add_argument("--threads", type=int, default=2, help="torch threads per process")
    p.add_argument("--plan", action="store_true", help="run the memory planner beside each training stage (minutes each)")
    p.add_argument("--plan-only", action="store_true",
                   help="print each training stage's memory plan without running it (implies --plan; the base and data "
                        "stages still run when their folders are missing: the plans read them)")
    p.add_argument("--smoke", action="store_true", help="tiny sizes and a tiny frame: checks that every stage runs")
    a = p.parse_args(argv)
    a.plan = a.plan or a.plan_only
    a.stages = [s for s in a.stages.split(",") if s]
    unknown = [s for s in a.stages if s not in STAGES]
    if unknown:
        p.error(f"--stages: unknown {unknown}; expected some of {','.join(STAGES)}")
    if a.smoke:
        a.size, a.adamw_layers, a.threads = "tiny", 2, 1
        if a.base == ROOT / "fullsize_base":
            a.base = a.work / "base_tiny"
    return a


def peak_of(cmd: list[str], env: dict, log: Path, timeout: float = 5400) -> tuple[int, float, float]:
    """(exit code, wall s, peak RSS GiB of the largest process of its tree) of one command."""
    t0 = time.perf_counter()
    with open(log, "a") as f:
        f.write(f"\n$ {' '.join(cmd)}\n")
        f.flush()
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, time.perf_counter() - t0, usage.ru_maxrss / 2**20


class Bench:
    def __init__(self, a: argparse.Namespace) -> None:
        self.a = a
        a.work.mkdir(parents=True, exist_ok=True)
        self.log = a.work / "full_size_cpu.log"
        self.env = {**os.environ, "OMP_NUM_THREADS": str(a.threads), "HF_HUB_OFFLINE": "1", "DS_ACCELERATOR": "cpu",
                    "DIT4DIT_DEVICE": "cpu", "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
        self.rows: list[tuple[str, str, float, float, str]] = []
        self.planned = False
        self.policy = a.work / "run_action/dit4dit_robotwin/checkpoints/step_000001/policy"

    def run(self, stage: str, what: str, cmd: list[str], plan: str = "") -> bool:
        rc, wall, rss = peak_of(cmd, self.env, self.log)
        status = "ok" if rc == 0 else f"FAILED (exit {rc}; {self.log})"
        self.rows.append((stage, what, wall, rss, plan if rc == 0 else status))
        print(f"{stage}: {what}: {wall:.1f} s, peak RSS {rss:.2f} GiB {'' if rc == 0 else status}", flush=True)
        return rc == 0

    def py(self, *args: str) -> list[str]:
        return [sys.executable, *args]

    # -- configs --------------------------------------------------------------------------------
    def overrides(self, base: Path, **extra: str) -> list[str]:
        a = self.a
        o = {
            "framework.cosmos25.base_model": str(base),
            "framework.cosmos25.prompt_cache": str(a.work / "prompt_cache.safetensors"),
            "datasets.vla_data.data_root_dir": str(a.work / "data"),
            "datasets.vla_data.data_mix": "[]",
            "datasets.vla_data.num_workers": "0",
            "datasets.vla_data.per_device_batch_size": "1",
            "trainer.max_train_steps": "1", "trainer.save_interval": "1", "trainer.eval_samples": "0",
            "trainer.num_warmup_steps": "1", "trainer.logging_frequency": "1",
            "trainer.enable_gradient_checkpointing": "true", "trainer.mixed_precision": "bf16",
        }
        # the real config's feature layer (17), or the last block of a shallower transformer
        blocks = json.loads((base / "transformer/config.json").read_text())["num_layers"]
        o["framework.cosmos25.extract_layer"] = str(min(17, blocks - 1))
        if a.smoke:  # the tiny model's frame and text length; the rest of the real config as it is
            o |= {"datasets.vla_data.image_size": "[32, 32]", "framework.cosmos25.max_sequence_length": "64",
                  "framework.action_model.action_model_type": "DiT-tiny",
                  "framework.action_model.hidden_size": "64", "framework.action_model.diffusion_model_cfg.num_layers": "2",
                  "framework.action_model.diffusion_model_cfg.output_dim": "64"}
        return [f"{k}={v}" for k, v in (o | extra).items()]

    def depth_base(self) -> Path:
        """A folder sharing the base folder's text encoder, VAE and tokenizer (links: the prompt
        cache's identity is the same), with a random transformer of --adamw-layers blocks."""
        from dit4dit_npu.weights.make_base import base_sizes, write_transformer

        out = self.a.work / f"base_L{self.a.adamw_layers}"
        if not (out / "transformer/config.json").is_file():
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir(parents=True)
            for part in ("vae", "text_encoder", "tokenizer", "scheduler", "model_index.json"):
                (out / part).symlink_to(self.a.base.resolve() / part)
            text = json.loads((self.a.base / "text_encoder/config.json").read_text())["text_config"]
            s = base_sizes(self.a.size, layers=self.a.adamw_layers, text_layers=text["num_hidden_layers"])
            write_transformer(out, s, int(4e9))
        return out

    def plan(self, overrides: list[str], batch: int, world: int) -> str:
        """The memory planner's prediction of this stage's peak resident memory per process (--host:
        a CPU host's process; its depth, batch, ZeRO stage (the config's DeepSpeed json: ZeRO-2,
        also on one rank), ranks and checkpointing), its activation fits measured once per work
        folder (--fits)."""
        if not self.a.plan and not (self.a.smoke and not self.planned):
            return "plan: --plan"
        self.planned = True  # --smoke plans once (a minute): it checks the path, its numbers mean nothing
        cfg = self.a.work / "plan_config.yaml"
        subprocess.run(self.py("-m", "dit4dit_npu.train", "--config", str(REAL), *overrides, "--migrate-config", str(cfg)),
                       cwd=ROOT, env=self.env, check=True, capture_output=True)
        out = self.a.work / "plan.json"
        smoke = ["--smoke"] if self.a.smoke else []
        r = subprocess.run(self.py("-m", "dit4dit_npu.train.memory_plan", "--config", str(cfg), "--zero", "2", "--host",
                                   "--world-size", str(world), "--batch", str(batch), "--threads", str(self.a.threads),
                                   "--fits", str(self.a.work / "plan_fits.json"), "--json", str(out), *smoke),
                           cwd=ROOT, env=self.env, capture_output=True, text=True)
        with open(self.log, "a") as f:
            f.write(f"\n$ memory plan ({' '.join(overrides[-3:])})\n{r.stdout}{r.stderr}")
        if r.returncode:
            return f"plan failed: {r.stderr.strip().splitlines()[-1:]}"
        return f"plan {json.loads(out.read_text())['per_card_bytes'] / 2**30:.2f} GiB"

    # -- stages -----------------------------------------------------------------------------------
    def stage_base(self) -> None:
        if (self.a.base / "model_index.json").is_file():
            print(f"base: {self.a.base} exists (not rewritten)")
            return
        self.run("base", f"dit4dit-make-base --size {self.a.size}", self.py(
            "-m", "dit4dit_npu.weights.make_base", "--size", self.a.size, "--out", str(self.a.base), "--load", "backbone"))

    def stage_data(self) -> None:
        if not (self.a.work / "data/demo/meta/info.json").is_file():
            shutil.rmtree(self.a.work / "data", ignore_errors=True)
            self.run("data", "demo dataset", self.py("-m", "dit4dit_npu.data.demo", "--out", str(self.a.work / "data/demo"),
                                                     "--episodes", "4", "--length", "24", "--tasks", "2", "--size", "64x64"))

    def stage_prompts(self) -> None:
        (self.a.work / "prompt_cache.safetensors").unlink(missing_ok=True)
        self.run("prompts", "prompt cache by the text encoder (bf16), released", self.py(
            str(ROOT / "bench/_full_size_child.py"), "prompts", str(REAL), *self.overrides(self.a.base)))

    def train(self, stage: str, base: Path, batch: int, world: int = 1, **extra: str) -> None:
        o = self.overrides(base, **{"run_root_dir": str(self.a.work / stage.replace("train-", "run_")),
                                    "datasets.vla_data.per_device_batch_size": str(batch), **extra})
        plan = self.plan(o, batch, world)
        if self.a.plan_only:
            self.rows.append((stage, f"batch {batch} x {world} rank(s), {base.name} (not run: --plan-only)", 0.0, 0.0, plan))
            return
        shutil.rmtree(self.a.work / stage.replace("train-", "run_"), ignore_errors=True)
        if world == 1:
            cmd = self.py("-m", "dit4dit_npu.train", "--config", str(REAL), *o)
        else:
            cmd = self.py("-m", "accelerate.commands.launch", "--config_file", str(ROOT / "configs/deepspeed/accelerate_zero2.yaml"),
                          "--num_processes", str(world), "--main_process_port", str(free_port()),
                          "-m", "dit4dit_npu.train", "--config", str(REAL), *o)
        self.run(stage, f"{extra.get('framework.cosmos25.training', 'joint')} batch {batch} x {world} rank(s), "
                 f"{'LoRA ' if 'framework.cosmos25.lora.rank' in extra else ''}{base.name}", cmd, plan)
        # The resumable state is measured (its size, in the table) and not used again: on a disk
        # of a few tens of GB it would crowd out the export stage (DeepSpeed's module state holds
        # the frozen weights too: 9.1 GB of the `training: action` run's 11 GB at full size).
        for state in (self.a.work / stage.replace("train-", "run_")).glob("*/checkpoints/*/state"):
            size = sum(f.stat().st_size for f in state.rglob("*") if f.is_file())
            self.rows[-1] = (*self.rows[-1][:4], f"{self.rows[-1][4]}; checkpoint state {size / 1e9:.2f} GB")
            shutil.rmtree(state)

    def stage_predict(self, dtype: str) -> None:
        self.run(f"predict-{dtype}", f"from_pretrained + predict_action ({dtype} backbone)",
                 self.py(str(ROOT / "bench/_full_size_child.py"), "predict", str(self.policy), dtype, self.instruction()))

    def instruction(self) -> str:
        """One of the demo data's instructions (in the policy's prompt cache)."""
        line = (self.a.work / "data/demo/meta/tasks.jsonl").read_text().splitlines()[0]
        return json.loads(line)["task"]

    def stage_check(self) -> None:
        size = (self.policy / "model.safetensors").stat().st_size if (self.policy / "model.safetensors").is_file() else 0
        self.run("check", f"from_pretrained default vs full_check (model.safetensors {size / 1e9:.2f} GB)",
                 self.py(str(ROOT / "bench/_full_size_child.py"), "check", str(self.policy)))

    def stage_serve(self) -> None:
        port = free_port()
        server = subprocess.Popen(self.py("-m", "dit4dit_npu.serve", "--policy", str(self.policy), "--port", str(port)),
                                  cwd=ROOT, env=self.env, stdout=open(self.a.work / "serve.log", "w"), stderr=subprocess.STDOUT)
        try:
            self.run("serve", "dit4dit_client round trip (the server's own RSS below)",
                     self.py(str(ROOT / "bench/_full_size_child.py"), "client", str(port), self.instruction()))
        finally:
            server.terminate()
            _, _, usage = os.wait4(server.pid, 0)
        print(f"serve: the server's peak RSS {usage.ru_maxrss / 2**20:.2f} GiB")
        self.rows.append(("serve (server)", "python -m dit4dit_npu.serve", float("nan"), usage.ru_maxrss / 2**20, ""))

    def stage_convert(self) -> None:
        out = self.a.work / "dit4dit_run"
        shutil.rmtree(out, ignore_errors=True)
        if self.run("convert", "python -m dit4dit_npu.convert to-dit4dit",
                    self.py("-m", "dit4dit_npu.convert", "to-dit4dit", str(self.policy), "--out", str(out),
                            # the smoke head is no entry of DiT4DiT's size table: named, as a user adding one would
                            *(["--action-model-type", "DiT-tiny"] if self.a.smoke else []))):
            self.run("convert-check", "its keys and shapes vs our model tree (meta)",
                     self.py(str(ROOT / "bench/_full_size_child.py"), "convert-check", str(out), str(self.policy)))

    def main(self) -> int:
        s = self.a.stages
        if self.a.plan_only:  # the training stages' plans alone (they need the base folder and the data)
            s = [x for x in s if x.startswith("train-") or x in ("base", "data")]
        for name in ("base", "data", "prompts"):
            if name in s:
                getattr(self, f"stage_{name}")()
        if "train-action" in s:
            self.train("train-action", self.a.base, 1, **{"framework.cosmos25.training": "action"})
        if "train-lora" in s:
            self.train("train-lora", self.a.base, 1, **{"framework.cosmos25.lora.rank": "16"})
        if any(x in s for x in ("train-adamw-b1", "train-adamw-b2", "train-zero2")):
            deep = self.depth_base()
            for b in (1, 2):
                if f"train-adamw-b{b}" in s:
                    self.train(f"train-adamw-b{b}", deep, b)
            if "train-zero2" in s:
                self.train("train-zero2", deep, 1, world=2)
        for dtype in ("bf16", "fp32"):
            if f"predict-{dtype}" in s:
                self.stage_predict(dtype)
        for name in ("check", "serve", "convert"):
            if name in s:
                getattr(self, f"stage_{name}")()
        return self.table()

    def table(self) -> int:
        print("\n| stage | what | wall s | peak RSS GiB | memory plan / note |\n|---|---|---|---|---|")
        for stage, what, wall, rss, note in self.rows:
            if planned_gib(note) is not None and rss > 0:
                plan, _, rest = note.partition(";")
                note = f"{plan} ({planned_gib(note) / rss:.2f} x measured){';' + rest if rest else ''}"
            print(f"| {stage} | {what} | {wall:.1f} | {rss:.2f} | {note} |")
        failed = [r[0] for r in self.rows if r[4].startswith("FAILED")]
        ratios = [planned_gib(r[4]) / r[3] for r in self.rows if planned_gib(r[4]) is not None and r[3] > 0]
        print(f"failed stages: {failed or 'none'}")
        print("speedup = the training stage whose planned / measured peak RSS is furthest from 1 (1.00 = exact)")
        print(f"speedup: {max(ratios, key=lambda x: abs(x - 1), default=1.0):.2f}")
        return 1 if failed else 0


def planned_gib(note: str) -> float | None:
    """The plan's GiB in a stage's note ("plan 12.34 GiB; ..."), None where there is none: a
    "plan failed: ..." note (the stage itself ran) or "plan: --plan" has no number."""
    m = re.match(r"plan (\d+(?:\.\d+)?) GiB", note)
    return float(m.group(1)) if m else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    raise SystemExit(Bench(args_of(None)).main())
