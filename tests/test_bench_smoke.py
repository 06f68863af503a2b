"""Every benchmark in bench/ still runs: each as a real process with ``--smoke`` (tiny sizes, a
couple of iterations), ending with its headline ratio ``speedup: X.XX`` (the house rule for
benchmarks). bench/train_step.py, bench/latency.py and the memory planner (python -m dit4dit_npu.train.memory_plan) run through
bench/full_size.sh --smoke, the script that runs them on an accelerator."""

from __future__ import annotations

import importlib.util
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.bench]

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "DIT4DIT_DEVICE": "cpu", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHON": sys.executable}
HEADLINE = re.compile(r"speedup: (\d+\.\d\d)")


def run(cmd: list[str], timeout: float = 600, **env: str) -> list[str]:
    r = subprocess.run(cmd, cwd=ROOT, env={**ENV, **env}, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout.strip().splitlines()


def assert_headline(line: str) -> None:
    m = HEADLINE.fullmatch(line)
    assert m, f"last line is not 'speedup: X.XX': {line!r}"
    assert math.isfinite(float(m.group(1))) and float(m.group(1)) > 0, line


@pytest.mark.parametrize("bench", ["loader.py", "lora_memory.py", "malloc.py", "policy_load.py", "serve_load.py",
                                   "sim_eval.py"])
def test_bench_smoke_ends_with_its_speedup(bench: str) -> None:
    if bench == "sim_eval.py" and importlib.util.find_spec("gym_aloha") is None:
        pytest.skip("simulation extra not installed (pip install -e '.[sim]')")
    assert_headline(run([sys.executable, f"bench/{bench}", "--smoke"])[-1])


def test_train_step_options_smoke_times_every_arm_against_no_video_and_joint() -> None:
    """bench/train_step.py --options: the cheaper joint-step options, each a row against a no-video
    step and today's joint step, the reference named on the line before last."""
    lines = run([sys.executable, "bench/train_step.py", "--options", "--smoke"])
    assert_headline(lines[-1])
    assert lines[-2].startswith("reference: today's joint step"), lines[-2]
    arms = {line.split()[0] for line in lines}
    assert {"no-video", "joint", "one-pass", "one-pass+level", "every-2", "every-4", "joint-skip", "fraction-0.5", "future-1"} <= arms


def test_compile_smoke_compares_eager_and_compiled_and_reports_the_warm_up() -> None:
    """bench/compile.py (trainer.compile / --compile): the same results from both copies, both timed
    rows, the warm-up apart, and the reference named on the line before last."""
    from dit4dit_npu import device as dev

    if (problem := dev.compile_problem()) is not None:
        pytest.skip(problem)
    lines = run([sys.executable, "bench/compile.py", "--smoke"])
    assert_headline(lines[-1])
    assert lines[-2].startswith("reference: the same model eager"), lines[-2]
    for start in ("same results: ", "training step, s", "predict_action batch 1, ms", "warm-up (compiling",
                  "a new batch size: ", "load average before: ", "load average after: "):
        assert any(line.startswith(start) for line in lines), (start, lines)


def test_full_size_script_smoke_runs_train_step_latency_and_memory(tmp_path: Path) -> None:
    log = tmp_path / "bench_full_size.log"
    lines = run(["bash", "bench/full_size.sh", "--smoke"], LOG=str(log))
    assert_headline(lines[-1])
    headlines = [line for line in log.read_text().splitlines() if line.startswith("speedup: ")]
    assert len(headlines) == 3, headlines  # one per bench, each its last line
    for line in headlines:
        assert_headline(line)


def test_full_size_cpu_smoke_runs_every_stage_through_the_users_commands(tmp_path: Path) -> None:
    """bash bench/full_size.sh --cpu --smoke: the CPU host's end-to-end pipeline at tiny sizes (a
    base folder written by dit4dit-make-base, the prompt cache, a frozen-backbone training and an
    AdamW one, predict, the content check, a served round trip, to-dit4dit and its key check): a
    row per stage, none failed, the headline last.

    The other stages (LoRA, batch 2, the 2-rank ZeRO-2 run, fp32 predict) differ from these only
    in their overrides, and each is one more fresh process (~10 s of imports before any work): the
    full tier runs this subset to stay within its time; `--stages` with every stage runs them all."""
    stages = ("base", "data", "prompts", "train-action", "train-adamw-b1", "predict-bf16", "check", "serve", "convert")

    log = tmp_path / "cpu.log"
    lines = run(["bash", "bench/full_size.sh", "--cpu", "--smoke", "--work", str(tmp_path / "work"),
                 "--stages", ",".join(stages)], timeout=1800, LOG=str(log))
    assert_headline(lines[-1])
    assert "failed stages: none" in lines, lines[-25:]
    rows = [line.split(" | ")[0].lstrip("| ") for line in lines if line.startswith("| ") and not line.startswith("| stage")]
    assert set(stages) <= set(rows), rows
    assert any(line.startswith("| train-action |") and "plan " in line for line in lines), lines[-25:]


def test_profile_medium_smoke_times_every_stage_and_names_its_reference() -> None:
    """bench/profile_medium.py (the per-stage profile): a row with a time for every training
    and inference stage in its tables (training at batch 2 and 4), and, ours only, a line saying the
    original is not measured."""
    lines = run([sys.executable, "bench/profile_medium.py", "--smoke"], DIT4DIT_ORIGINAL_ROOT="")
    assert_headline(lines[-1])
    assert lines[-2].startswith("reference: none"), lines[-2]
    rows = [line.split(" | ") for line in lines if line.startswith("| ") and not line.startswith("| stage")]
    stages = [r[0].lstrip("| ") for r in rows]
    for stage in ("VAE encode", "feature pass", "video flow-matching bwd", "optimizer step", "PolicyIO parse",
                  "action sampling", "unnormalize"):
        assert stage in stages, stages
    assert stages.count("unstaged call") == 3, stages
    assert all(math.isfinite(float(r[1])) and float(r[1]) >= 0 for r in rows), rows


@pytest.mark.skipif(not (os.environ.get("DIT4DIT_ORIGINAL_ROOT") and os.environ.get("DIT4DIT_ORIGINAL_PYTHON")),
                    reason="needs the original DiT4DiT: DIT4DIT_ORIGINAL_ROOT (a checkout) and DIT4DIT_ORIGINAL_PYTHON")
def test_profile_medium_smoke_against_the_original() -> None:
    """With the original (its side virtualenv): both sides per stage and a same-maths ceiling for
    training at batch 2 and 4 and for predict_action, the reference named on the line before last."""
    lines = run([sys.executable, "bench/profile_medium.py", "--smoke"])
    assert_headline(lines[-1])
    assert lines[-2].startswith("reference: original DiT4DiT"), lines[-2]
    assert sum(line.startswith("same-maths ceiling: ") for line in lines) == 3, lines
    rows = [line.split(" | ") for line in lines if line.startswith("| condition encode (per sample) |")]
    assert len(rows) == 2 and all(r[1] == "-" and float(r[2]) > 0 for r in rows), rows  # ours skips it


def test_parity_smoke_without_the_original_says_it_was_skipped() -> None:
    """The original DiT4DiT is an external checkout with its own virtualenv: without it the smoke
    run is one line (with it, ``--smoke --original-root DIR --original-python PY`` compares the
    libero preset)."""
    lines = run([sys.executable, "bench/parity_dit4dit.py", "--smoke"])
    assert len(lines) == 1 and "skipped" in lines[0] and "--original-root" in lines[0], lines


def test_rtc_sim_smoke_ends_with_its_speedup(tmp_path: Path) -> None:
    """The scripted expert through every execution mode (sync, async, ensemble, RTC) at 0 and 100
    ms (no policy: the smoke run checks the sweep, the table and the plot, not RTC's effect)."""
    if importlib.util.find_spec("gym_aloha") is None:
        pytest.skip("simulation extra not installed (pip install -e '.[sim]')")
    lines = run([sys.executable, "bench/rtc_sim.py", "--smoke", "--out", str(tmp_path / "rtc")])
    assert (tmp_path / "rtc").is_dir() and any((tmp_path / "rtc").iterdir())
    assert_headline(lines[-1])


def test_latent_stats_command_smoke_ends_with_its_speedup(demo_root: Path) -> None:
    lines = run([sys.executable, "-m", "dit4dit_npu.data.latent_stats", "--smoke", "--config",
                 "configs/robotwin/dit4dit_robotwin_tiny.yaml", f"datasets.vla_data.data_root_dir={demo_root}",
                 "datasets.vla_data.generate_demo_if_missing=false"])
    assert any(line.strip().startswith("vae_latents_std: [") for line in lines), lines
    assert_headline(lines[-1])


def test_latent_verify_smoke_ends_with_the_share_of_an_epoch_spent_verifying() -> None:
    """bench/latent_verify.py: the latent cache's first-read content check against an epoch of
    training from the cache; its headline is that share (the goal: <= 5%), not a speedup."""
    import re

    lines = run([sys.executable, "bench/latent_verify.py", "--smoke"])
    m = re.fullmatch(r"verify/epoch: (\d+\.\d{4})", lines[-1])
    assert m and 0 < float(m.group(1)) < 1, lines[-3:]


def test_sim_replay_and_success_curve_smoke_end_with_a_success_line(tmp_path: Path) -> None:
    """The two closed-loop benches measure a success rate, so their last line is ``success k/n``
    (documented in each): the replay check's whole path (demos, ground truth, latent cache,
    training, closed loop on the demo seeds), then the success-vs-steps curve of its run."""
    if importlib.util.find_spec("gym_aloha") is None:
        pytest.skip("simulation extra not installed (pip install -e '.[sim]')")
    success = re.compile(r"success \d+/\d+.*")
    lines = run([sys.executable, "bench/sim_replay.py", "--smoke", "--out", str(tmp_path / "replay")])
    assert success.fullmatch(lines[-1]), lines[-5:]
    lines = run([sys.executable, "-m", "dit4dit_npu.train.success_curve", "--smoke", "--run", str(tmp_path / "replay_smoke" / "replay1")])
    assert success.fullmatch(lines[-1]), lines[-5:]


def test_serve_soak_smoke_serves_without_errors_and_ends_with_the_memory_growth() -> None:
    """A soak has no speedup: its last line is the server's resident-memory growth over the run,
    ``rss_growth: X.XX%`` (documented in bench/serve_soak.py), after the requests served and the
    errors (none expected on loopback)."""
    lines = run([sys.executable, "bench/serve_soak.py", "--smoke"])
    assert re.fullmatch(r"rss_growth: -?\d+\.\d\d%", lines[-1]), lines[-8:]
    assert "errors: 0" in lines, lines[-8:]
    served = next(line for line in lines if line.startswith("requests served: "))
    assert int(served.split()[2]) > 0, served


def test_full_size_cpu_table_survives_a_stage_whose_plan_failed(tmp_path: Path, capsys) -> None:
    # a training stage that ran while its memory plan failed has the note "plan failed: ...": the
    # table (printed after hours at full size) read that note's second word as the planned GiB and
    # ended in a ValueError, the results table lost
    spec = importlib.util.spec_from_file_location("full_size_cpu", ROOT / "bench/full_size_cpu.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    bench = mod.Bench(mod.args_of(["--work", str(tmp_path), "--stages", "check"]))
    bench.rows = [("train-action", "action", 10.0, 4.0, "plan failed: ['error: ...']"),
                  ("train-lora", "LoRA", 10.0, 5.0, "plan 5.50 GiB; checkpoint state 1.00 GB"),
                  ("train-zero2", "b1 x 2 (not run: --plan-only)", 0.0, 0.0, "plan 3.00 GiB")]
    assert bench.table() == 0
    out = capsys.readouterr().out
    assert "plan 5.50 GiB (1.10 x measured); checkpoint state 1.00 GB" in out
    assert out.strip().splitlines()[-1] == "speedup: 1.10"
