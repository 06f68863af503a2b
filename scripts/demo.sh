#!/usr/bin/env bash
# The main job on the embedded default: set up .venv, encode the generated demo data (created on
# first use) into a latent cache once (the VAE then never runs in a training step), train the tiny
# model from it, then evaluate the exported policy on the held-out episodes (raw frames, as deployed).
# Safe to run twice: cached episodes are skipped, a finished run is resumed (nothing to do) and
# re-evaluated.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup_env.sh
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
CONFIG=configs/robotwin/dit4dit_robotwin_tiny.yaml
# One sub-folder per dataset fingerprint: regenerated demo data is encoded anew, never mixed up.
CACHE=demo_data/robotwin_demo_latents
.venv/bin/python -m dit4dit_npu.data.encode_latents --config "$CONFIG" --out "$CACHE" "$@"
.venv/bin/python -m dit4dit_npu.train --config "$CONFIG" trainer.resume=auto "datasets.vla_data.latent_cache=$CACHE" "$@"
RUN_DIR="$(.venv/bin/python -m dit4dit_npu.train --config "$CONFIG" "$@" --dry-run | .venv/bin/python -c '
import sys, yaml; c = yaml.safe_load(sys.stdin); print(c["run_root_dir"] + "/" + c["run_id"])')"
POLICY="$(ls -d "$RUN_DIR"/checkpoints/step_*/policy | sort | tail -1)"
# --blank-cameras: the same policy scored again with every camera a constant grey image (printed
# beside the real ratio, in metrics.json as cameras_blanked): clearly worse = it uses its cameras.
.venv/bin/python -m dit4dit_npu.eval --policy "$POLICY" --out "$RUN_DIR/eval" --blank-cameras
echo "policy: $POLICY"
echo "eval:   $RUN_DIR/eval/metrics.json"
