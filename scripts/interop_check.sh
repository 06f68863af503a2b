#!/usr/bin/env bash
# Interop check (run by hand, not in CI): do the tools users already run accept what this project
# writes and serves? Uses the real libraries, each in its own cached virtualenv under .interop/
# (git-ignored), because they pin versions our environment cannot hold (lerobot 0.4.4: torch < 2.11,
# diffusers < 0.36):
#   .interop/lerobot  lerobot==0.4.4 (from PyPI, with its own torch)
#   .interop/openpi   openpi-client + typing_extensions (openpi-client needs it but does not declare it)
# Checks, one PASS/FAIL line each (exit 1 on any FAIL):
#   lerobot's LeRobotDataset loads our v3.0 demo data; its samples equal ours exactly (frames,
#     state, action, task, timestamps, with and without delta_timestamps), with each video decoder
#     lerobot has here (torchcodec needs FFmpeg's shared libraries, e.g. `apt-get install ffmpeg`);
#   lerobot reads meta/stats.json (image stats per camera, lerobot's own shape validation);
#   lerobot's v2.1 -> v3.0 converter accepts our v2.1 data, and the result equals our reading of it;
#   lerobot-dataset-viz writes its .rrd; lerobot-train runs 2 steps of ACT on our data;
#   an unchanged openpi WebsocketClientPolicy + ActionChunkBroker gets actions from
#     `python -m dit4dit_npu.serve` (a tiny policy trained 2 steps on the demo data), raises on a
#     bad observation, and sends openpi's ALOHA observation layout.
# Usage: bash scripts/interop_check.sh          (INTEROP_DIR=... to put the venvs elsewhere)
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
INTEROP="${INTEROP_DIR:-$ROOT/.interop}"
WORK="$INTEROP/work"
PY="$ROOT/.venv/bin/python"  # this project's environment (scripts/setup_env.sh)
BASE_PY="${PYTHON:-python3}"
HERE="$ROOT/scripts/interop"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" HF_HUB_OFFLINE=1 WANDB_MODE=disabled PYTHONUNBUFFERED=1
FAILS=0
SERVER_PID=""
trap '[ -n "$SERVER_PID" ] && kill "$SERVER_PID" 2>/dev/null' EXIT

say() { echo "$*"; case "$*" in FAIL*) FAILS=$((FAILS + 1)) ;; esac; }

# run_check NAME LOG CMD...: runs CMD (output to LOG), prints the PASS/FAIL lines it printed; a
# non-zero exit that printed no FAIL line is one FAIL naming the log's last line.
run_check() {
  local name="$1" log="$2" rc
  shift 2
  "$@" >"$log" 2>&1
  rc=$?
  local lines
  lines="$(grep -E '^(PASS|FAIL) ' "$log")"
  if [ -n "$lines" ]; then
    while IFS= read -r line; do say "$line"; done <<<"$lines"
  fi
  if [ $rc -ne 0 ] && ! grep -qE '^FAIL ' "$log"; then
    say "FAIL $name: exit $rc: $(grep -v '^\s*$' "$log" | tail -1) (log: $log)"
  fi
  return $rc
}

venv() {  # venv DIR STAMP PACKAGES...: create once, reinstall when the package list changes
  local dir="$1" stamp="$2"
  shift 2
  if [ -x "$dir/bin/python" ] && [ "$(cat "$dir/.interop-stamp" 2>/dev/null)" = "$stamp" ]; then
    return 0
  fi
  echo "[interop] building $dir ($*) ..." >&2
  rm -rf "$dir"
  "$BASE_PY" -m venv "$dir" || return 1
  "$dir/bin/python" -m pip install --quiet --disable-pip-version-check "$@" 2>&1 \
    | sed '/is ignored: it is neither a file nor a directory/d' >&2 || return 1
  [ "${PIPESTATUS[0]}" -eq 0 ] || return 1
  echo "$stamp" >"$dir/.interop-stamp"
}

[ -x "$PY" ] || { echo "FAIL setup: $PY missing (run bash scripts/setup_env.sh)"; exit 1; }
# The server and our reader must be this checkout's code: a venv installed editable from another
# checkout (a git worktree sharing main's .venv) would otherwise check that one's code and pass.
# Asked from outside the checkout, as scripts/interop/ours.py imports (its sys.path[0] is its own
# folder; only `python -m` and `-c` put the current folder first).
PKG="$(cd / && "$PY" -c 'import os, dit4dit_npu; print(os.path.dirname(os.path.dirname(os.path.realpath(dit4dit_npu.__file__))))' 2>&1)"
if [ "$PKG" != "$(pwd -P)" ]; then
  echo "FAIL setup: $PY imports dit4dit_npu from $PKG, not this checkout $(pwd -P) (run with PYTHONPATH=$ROOT:$ROOT/client)"
  exit 1
fi
venv "$INTEROP/lerobot" "lerobot==0.4.4" "lerobot==0.4.4" || { echo "FAIL setup: cannot install lerobot==0.4.4"; exit 1; }
venv "$INTEROP/openpi" "openpi-client typing_extensions" openpi-client typing_extensions \
  || { echo "FAIL setup: cannot install openpi-client"; exit 1; }
LR="$INTEROP/lerobot/bin"
OP="$INTEROP/openpi/bin/python"

rm -rf "$WORK" && mkdir -p "$WORK/logs" "$WORK/data"
V3="$WORK/data/robotwin_demo"  # the name the tiny config trains on
V21="$WORK/conv/local/demo_v21"
echo "[interop] lerobot $("$LR/python" -c 'import lerobot; print(lerobot.__version__)' 2>/dev/null), openpi-client $("$OP" -m pip show openpi-client 2>/dev/null | sed -n 's/^Version: //p'), work folder $WORK" >&2
if ! "$PY" -m dit4dit_npu.data.demo --out "$V3" --version v3.0 --episodes 6 --length 32 >"$WORK/logs/demo.log" 2>&1 \
  || ! "$PY" -m dit4dit_npu.data.demo --out "$V21" --version v2.1 --episodes 6 --length 32 >>"$WORK/logs/demo.log" 2>&1; then
  echo "FAIL setup: demo data ($(tail -1 "$WORK/logs/demo.log"))"
  exit 1
fi
"$PY" "$HERE/ours.py" samples "$V3" "$WORK/ours_v3.npz" >"$WORK/logs/ours.log" 2>&1 \
  && "$PY" "$HERE/ours.py" samples "$V21" "$WORK/ours_v21.npz" >>"$WORK/logs/ours.log" 2>&1 \
  || { echo "FAIL setup: our reader ($(tail -1 "$WORK/logs/ours.log"))"; exit 1; }

# lerobot's default decoder is torchcodec, which loads the system's FFmpeg; without it lerobot
# (and its visualizer, which has no decoder option) cannot decode any video.
BACKENDS="pyav"
if "$LR/python" -c "from torchcodec.decoders import VideoDecoder as D; D('$(ls "$V3"/videos/*/chunk-000/file-000.mp4 | head -1)')[0]" >/dev/null 2>&1; then
  BACKENDS="torchcodec pyav"
else
  echo "[interop] torchcodec cannot load FFmpeg here: lerobot checks use its pyav decoder" >&2
fi

# --- lerobot -------------------------------------------------------------------------------------
for b in $BACKENDS; do
  run_check "lerobot loads v3.0 ($b)" "$WORK/logs/lerobot_$b.log" "$LR/python" "$HERE/lerobot_side.py" compare "$V3" "$WORK/ours_v3.npz" "$b"
done
run_check "lerobot stats" "$WORK/logs/stats.log" "$LR/python" "$HERE/lerobot_side.py" stats "$V3"

if run_check "lerobot v2.1->v3.0 converter" "$WORK/logs/convert.log" \
  "$LR/python" -m lerobot.datasets.v30.convert_dataset_v21_to_v30 --repo-id local/demo_v21 --root "$WORK/conv" --push-to-hub false; then
  version="$("$PY" -c "import json, sys; print(json.load(open(sys.argv[1]))['codebase_version'])" "$V21/meta/info.json")"
  say "PASS lerobot v2.1->v3.0 converter accepts our v2.1 data (the result is $version)"
  run_check "converted v2.1 equals ours" "$WORK/logs/converted.log" "$LR/python" "$HERE/lerobot_side.py" compare "$V21" "$WORK/ours_v21.npz" "${BACKENDS%% *}"
fi

if [ "${BACKENDS%% *}" = "torchcodec" ]; then  # the CLI users run
  run_check "lerobot-dataset-viz" "$WORK/logs/viz.log" "$LR/lerobot-dataset-viz" --repo-id local/dit4dit_demo --root "$V3" \
    --episode-index 0 --save 1 --output-dir "$WORK/viz" --num-workers 0 \
    && { rrd="$(ls "$WORK"/viz/*.rrd 2>/dev/null | head -1)"
         if [ -s "$rrd" ]; then say "PASS lerobot-dataset-viz wrote $(basename "$rrd") ($(stat -c %s "$rrd") bytes) for episode 0"
         else say "FAIL lerobot-dataset-viz wrote no .rrd (log: $WORK/logs/viz.log)"; fi; }
else
  run_check "lerobot visualizer" "$WORK/logs/viz.log" "$LR/python" "$HERE/lerobot_side.py" viz "$V3" "$WORK/viz" pyav
fi

run_check "lerobot-train" "$WORK/logs/lerobot_train.log" "$LR/lerobot-train" --dataset.repo_id=local/dit4dit_demo \
  --dataset.root="$V3" --dataset.video_backend="${BACKENDS%% *}" --policy.type=act --policy.device=cpu \
  --policy.pretrained_backbone_weights=null --policy.push_to_hub=false --policy.dim_model=64 \
  --policy.n_encoder_layers=1 --policy.n_decoder_layers=1 --policy.chunk_size=8 --policy.n_action_steps=8 \
  --steps=2 --batch_size=4 --num_workers=0 --save_freq=2 --log_freq=1 --eval_freq=0 --wandb.enable=false \
  --output_dir="$WORK/lerobot_train" \
  && { if [ -f "$WORK/lerobot_train/checkpoints/000002/pretrained_model/model.safetensors" ]; then
         say "PASS lerobot-train: 2 steps of ACT on our v3.0 data (normalized with its image stats), checkpoint written"
       else say "FAIL lerobot-train wrote no checkpoint (log: $WORK/logs/lerobot_train.log)"; fi; }

# the other way: a dataset lerobot itself recorded (its av1 videos, its stats.json), read by us
if run_check "lerobot writes" "$WORK/logs/lerobot_write.log" "$LR/python" "$HERE/lerobot_side.py" write "$WORK/lerobot_written" \
  && run_check "our reader on lerobot data" "$WORK/logs/ours_lerobot.log" "$PY" "$HERE/ours.py" samples "$WORK/lerobot_written" "$WORK/ours_lr.npz"; then
  run_check "our reader on lerobot data" "$WORK/logs/ours_lerobot_cmp.log" "$LR/python" "$HERE/lerobot_side.py" compare "$WORK/lerobot_written" "$WORK/ours_lr.npz" "${BACKENDS%% *}"
  run_check "our reader on lerobot stats" "$WORK/logs/ours_lerobot_stats.log" "$PY" "$HERE/ours.py" stats "$WORK/lerobot_written"
fi

# --- openpi --------------------------------------------------------------------------------------
if "$PY" -m dit4dit_npu.train --config configs/robotwin/dit4dit_robotwin_tiny.yaml \
  datasets.vla_data.data_root_dir="$WORK/data" run_root_dir="$WORK/runs" run_id=interop \
  trainer.max_train_steps=2 trainer.save_interval=2 trainer.eval_interval=1000 trainer.logging_frequency=1 \
  >"$WORK/logs/train.log" 2>&1; then
  POLICY="$(ls -d "$WORK"/runs/interop/checkpoints/step_*/policy | sort | tail -1)"
  PORT="$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
  "$PY" -m dit4dit_npu.serve --policy "$POLICY" --port "$PORT" >"$WORK/logs/serve.log" 2>&1 &
  SERVER_PID=$!
  "$PY" "$HERE/ours.py" observations "$POLICY" "$V3" "$WORK/obs.npz" >"$WORK/logs/obs.log" 2>&1 \
    || say "FAIL openpi: observations ($(tail -1 "$WORK/logs/obs.log"))"
  if "$PY" -c "
import sys, time, urllib.request
for _ in range(240):
    try:
        urllib.request.urlopen('http://127.0.0.1:$PORT/healthz', timeout=1); sys.exit(0)
    except OSError:
        time.sleep(0.5)
sys.exit(1)" && [ -f "$WORK/obs.npz" ]; then
    run_check "openpi client" "$WORK/logs/openpi.log" "$OP" "$HERE/openpi_side.py" 127.0.0.1 "$PORT" "$WORK/obs.npz"
  else
    say "FAIL openpi: the server did not come up ($(tail -1 "$WORK/logs/serve.log"))"
  fi
  kill "$SERVER_PID" 2>/dev/null
  wait "$SERVER_PID" 2>/dev/null
  SERVER_PID=""
else
  say "FAIL openpi: training the tiny policy failed ($(tail -1 "$WORK/logs/train.log"))"
fi

echo "[interop] $FAILS FAIL(s); logs in $WORK/logs" >&2
[ "$FAILS" -eq 0 ]
