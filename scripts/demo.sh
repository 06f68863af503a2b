#!/usr/bin/env bash
# The main job on the embedded default: set up .venv, train the tiny model on the generated demo
# data (created on first use), then evaluate the exported policy on the held-out episodes.
# Safe to run twice: a finished run is resumed (nothing to do) and re-evaluated.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup_env.sh
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
CONFIG=configs/robotwin/dit4dit_robotwin_tiny.yaml
.venv/bin/python -m dit4dit_npu.train --config "$CONFIG" trainer.resume=auto "$@"
RUN_DIR="$(.venv/bin/python -m dit4dit_npu.train --config "$CONFIG" "$@" --dry-run | .venv/bin/python -c '
import sys, yaml; c = yaml.safe_load(sys.stdin); print(c["run_root_dir"] + "/" + c["run_id"])')"
POLICY="$(ls -d "$RUN_DIR"/checkpoints/step_*/policy | sort | tail -1)"
# --blank-cameras: the same policy scored again with every camera a constant grey image (printed
# beside the real ratio, in metrics.json as cameras_blanked): clearly worse = it uses its cameras.
.venv/bin/python -m dit4dit_npu.eval --policy "$POLICY" --out "$RUN_DIR/eval" --blank-cameras
echo "policy: $POLICY"
echo "eval:   $RUN_DIR/eval/metrics.json"
