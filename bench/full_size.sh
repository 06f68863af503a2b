#!/usr/bin/env bash
# The full-size benches in one prepared run, for a host with one accelerator (CUDA or Ascend):
# the real architecture with random weights (no checkpoint needed), the real RoboTwin config.
#
#   bash bench/full_size.sh [PEAK_TFLOPS]      # e.g. 989 (H200 dense bf16), 313 (Ascend 910B)
#   bash bench/full_size.sh --smoke            # any host, seconds: the same three benches at tiny sizes
#
# 1. bench/train_step.py --full-size: training-step time (ours / from cached latents / the
#    reference-faithful step), MFU against PEAK_TFLOPS, the allocator's step peak;
# 2. bench/latency.py --full-size: predict_action latency per stage, ours vs reference;
# 3. python -m dit4dit_npu.train.memory_plan (dit4dit-memory-plan) --zero 0 --world-size 1 --check: the per-card plan for one card without
#    DeepSpeed, and one real full-size training step measured by the allocator against the plan.
# Each prints `speedup: X.XX` last; the whole log goes to bench_full_size.log (or $LOG).
# --smoke runs each with its own --smoke instead of the full size (the tests do, on CPU): it checks
# that this script and the three benches still run; its numbers mean nothing.
#
#   bash bench/full_size.sh --cpu [--base DIR] [--stages a,b] [--plan] ...   # a CPU host, no accelerator
#   bash bench/full_size.sh --cpu --smoke                                  # the same stages at tiny sizes
#
# --cpu: bench/full_size_cpu.py (its --help lists the stages and flags): the real model, written as a
# random base folder and loaded as users load one, end to end on a 2-core / 24 GiB CPU host, one
# table of wall time, peak RSS and the memory plan per stage (docs/performance.md).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY="${PYTHON:-.venv/bin/python}"
LOG="${LOG:-bench_full_size.log}"
if [ "${1:-}" = "--cpu" ]; then
  shift
  export DIT4DIT_DEVICE=cpu DS_ACCELERATOR=cpu
  "$PY" bench/full_size_cpu.py "$@" 2>&1 | tee "$LOG"
  exit "${PIPESTATUS[0]}"
fi
if [ "${1:-}" = "--smoke" ]; then
  train=(--smoke --peak-tflops 989)
  latency=(--smoke)
  memory=(--smoke --check)
else
  PEAK="${1:-989}"
  train=(--full-size --peak-tflops "$PEAK" --steps 5 --batch-size 4 --threads 8)
  latency=(--full-size --skip-small --iters 20 --threads 8)
  memory=(--check --threads 8)
fi
eval "$("$PY" -m dit4dit_npu.device env)"   # the device layer's launch environment for this host
"$PY" -m dit4dit_npu.device
{
  "$PY" bench/train_step.py "${train[@]}"
  "$PY" bench/latency.py "${latency[@]}"
  "$PY" -m dit4dit_npu.train.memory_plan --zero 0 --world-size 1 --batch 4 "${memory[@]}"
} 2>&1 | tee "$LOG"
