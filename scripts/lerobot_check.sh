#!/usr/bin/env bash
# lerobot 0.6 check (run by hand, not in CI): does lerobot 0.6.1 run a policy folder of ours
# through our plugin (lerobot_plugin/, the package lerobot_policy_dit4dit) in its own envs?
# lerobot 0.6.1 needs Python >= 3.12, so it lives in a side virtualenv under .lerobot06/
# (git-ignored) that holds both: lerobot[metaworld] 0.6.1 from PyPI (its torch, diffusers and
# transformers are inside this project's bounds), this checkout (editable, no dependencies of its
# own beyond what inference needs: DeepSpeed is training-only), the client, and the plugin.
# Checks, one PASS/FAIL line each (exit 1 on any FAIL):
#   the plugin registers --policy.type=dit4dit with lerobot's own PreTrainedConfig registry;
#   a tiny policy of ours (trained 2 steps here on the demo data) loads through lerobot's
#     make_policy/make_pre_post_processors, its select_action pops a chunk from a queue refilled
#     with predict_action (equal to predict_action's own chunk), reset clears the queue;
#   Meta-World (lerobot's metaworld env + the metaworld package's scripted experts): one episode's
#     render + step cost and the experts' success on a few tasks (scripts/lerobot06/metaworld_side.py);
#   the Meta-World smoke: expert demos written as a LeRobot dataset by our writer (each episode
#     carries its task's instruction), 2 training steps of the tiny policy on it, and
#     `lerobot-eval --policy.path=<that policy folder> --env.type=metaworld` for 1 episode.
# Usage: bash scripts/lerobot_check.sh            (LEROBOT06_DIR=... puts the venv elsewhere;
#        PYTHON312=... names the Python 3.12 to build it on)
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
SIDE="${LEROBOT06_DIR:-$ROOT/.lerobot06}"
WORK="$SIDE/work"
PY="$ROOT/.venv/bin/python"  # this project's environment (scripts/setup_env.sh): trains the tiny policy
# The first of these that runs and is Python >= 3.12 (a pyenv shim may exist and fail to run).
BASE_PY=""
for candidate in ${PYTHON312:-} python3.12 python3.13 /root/.pyenv/versions/3.12.*/bin/python3.12; do
  if "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 12))' >/dev/null 2>&1; then
    BASE_PY="$candidate"
    break
  fi
done
HERE="$ROOT/scripts/lerobot06"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" HF_HUB_OFFLINE=1 WANDB_MODE=disabled PYTHONUNBUFFERED=1
export MUJOCO_GL="${MUJOCO_GL:-egl}"
FAILS=0

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

# What the side venv holds. lerobot's extras: metaworld (the env, metaworld==3.0.0, its dataset
# tools), evaluation (PyAV), and the diffusers/transformers/accelerate/peft it pins, which our
# model code needs too. Then the runtime dependencies of dit4dit_npu that lerobot does not bring.
LEROBOT_SPEC="lerobot[metaworld,evaluation,diffusers-dep,transformers-dep,accelerate-dep,peft-dep]==0.6.1"
OURS_DEPS="tokenizers>=0.22 omegaconf pyyaml msgpack websockets>=15 matplotlib"
STAMP="$( (echo "$LEROBOT_SPEC $OURS_DEPS"; cat "$ROOT/pyproject.toml" "$ROOT/client/pyproject.toml") | sha256sum | cut -c1-16)"

build() {  # create once; rebuild when the package lists or a pyproject change
  local dir="$SIDE/venv"
  if [ -x "$dir/bin/python" ] && [ "$(cat "$dir/.lerobot06-stamp" 2>/dev/null)" = "$STAMP" ]; then
    return 0
  fi
  echo "[lerobot06] building $dir on $BASE_PY ..." >&2
  rm -rf "$dir"
  "$BASE_PY" -m venv "$dir" || return 1
  local pip=("$dir/bin/python" -m pip install --quiet --disable-pip-version-check)
  { "${pip[@]}" --upgrade pip \
    && "${pip[@]}" "$LEROBOT_SPEC" $OURS_DEPS \
    && "${pip[@]}" "$ROOT/client" \
    && "${pip[@]}" --no-deps -e "$ROOT"; } 2>&1 | sed '/is ignored: it is neither a file nor a directory/d' >&2
  [ "${PIPESTATUS[0]}" -eq 0 ] || return 1
  echo "$STAMP" >"$dir/.lerobot06-stamp"
}

[ -n "$BASE_PY" ] || { echo "FAIL setup: no Python >= 3.12 found (lerobot 0.6.1 needs it): set PYTHON312 to one"; exit 1; }
build || { echo "FAIL setup: cannot build the lerobot 0.6.1 side venv in $SIDE/venv"; exit 1; }
[ "${1:-}" = "--build-only" ] && exit 0
