#!/usr/bin/env bash
# lerobot 0.6 check (run by hand, not in CI): does lerobot 0.6.1 run a policy folder of ours
# through our plugin (lerobot_plugin/, the package lerobot_policy_dit4dit) in its own envs?
# lerobot 0.6.1 needs Python >= 3.12, so it lives in a side virtualenv under .lerobot06/
# (git-ignored) that holds both: lerobot[metaworld] 0.6.1 from PyPI (its torch, diffusers and
# transformers are inside this project's bounds), this checkout (editable, no dependencies of its
# own beyond what inference needs: DeepSpeed is training-only), the client, and the plugin.
# Checks, one PASS/FAIL line each (exit 1 on any FAIL; the costs are PASS lines that carry numbers):
#   Meta-World's cost here (scripts/lerobot06/metaworld_side.py cost): a render of lerobot's camera
#     (as its env renders, and with shadows off) plus a physics step, at 480x480 (what lerobot-eval
#     renders), 224x224 and 128x128; the metaworld package's scripted experts' own success on five tasks;
#   the Meta-World smoke: 1 expert demo recorded through lerobot's own MetaworldEnv and written as a
#     LeRobot dataset by our writer, its task's description as the episode's instruction
#     (metaworld_side.py demos); 2 training steps of configs/metaworld/dit4dit_metaworld_tiny.yaml on
#     it, in this project's own environment; dit4dit-lerobot-prepare on the policy folder;
#   the plugin through lerobot's own make_policy / make_pre_post_processors (plugin_side.py):
#     lerobot's plugin discovery registers --policy.type=dit4dit; lerobot's batch gives
#     predict_action's chunk; select_action pops it from a queue refilled when empty; reset empties
#     it; a missing camera, an empty task, a too long n_action_steps are one line each;
#   `lerobot-eval --policy.path=<that policy folder> --env.type=metaworld` for 1 episode, and the same
#     in the lean env (lerobot_plugin/env: --env.type=metaworld_lean, lerobot's env rendering 128x128
#     without shadows or multisampling), which is first checked against the stock env (metaworld_side.py
#     lean: registered by lerobot's discovery, lerobot's own vector envs (async: its lazy wrapper),
#     sized through lerobot's create_envs, the same states,
#     rewards and end under the same actions, pictures that differ only in shading).
# Usage: bash scripts/lerobot_check.sh [--build-only]   (--build-only: build the side venv, install the plugins)
#   LEROBOT06_DIR=...   the side venv's folder (default .lerobot06/)
#   PYTHON312=...       the Python >= 3.12 to build it on (default: the first found)
#   PROJECT_PYTHON=...  this project's interpreter (default .venv/bin/python), which trains the
#                       smoke's policy; it must import this checkout's dit4dit_npu (PYTHONPATH)
#   METAWORLD_TASK, METAWORLD_COST_TASKS, METAWORLD_COST_EPISODES: the tasks and episodes
# Costs (2026-12-06, 2 shared cores): the build 6-8 min and 5.9 GB; the checks ~15 min, most of it
# lerobot-eval's one episode (500 steps at ~1 s each: two 480x480 software renders per step).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# A setting set but empty is refused, not taken as its default (LEROBOT06_DIR= would build under /venv).
for v in LEROBOT06_DIR PYTHON312 PROJECT_PYTHON METAWORLD_TASK METAWORLD_COST_TASKS METAWORLD_COST_EPISODES OMP_NUM_THREADS; do
    if [ -n "${!v+x}" ] && [ -z "${!v}" ]; then echo "error: $v=: expected a value (unset it for the default)" >&2; exit 2; fi
done
SIDE="${LEROBOT06_DIR:-$ROOT/.lerobot06}"
WORK="$SIDE/work"
PY="${PROJECT_PYTHON:-$ROOT/.venv/bin/python}"  # this project's environment (scripts/setup_env.sh): trains the tiny policy
# PYTHON312, when given, must be one (not passed over for another); else the first of these that
# runs and is Python >= 3.12 (a pyenv shim may exist and fail to run).
if [ -n "${PYTHON312:-}" ] && ! "$PYTHON312" -c 'import sys; sys.exit(sys.version_info < (3, 12))' >/dev/null 2>&1; then
    echo "error: PYTHON312=$PYTHON312: expected a Python >= 3.12 that runs (unset it to take the first found)" >&2; exit 2
fi
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
# metaworld 3.0.0 asks only for mujoco>=3.0.0, but its mocap weld setup writes 11 numbers per
# equality constraint: mujoco 3.17 and 4.0.1 hold 12 (mjNEQDATA), a ValueError on the first env.
# 3.8.1 (11, the version this project's own environment runs) is the one checked here.
PINS="mujoco==3.8.1"
# The stamp reads the pyprojects' [project] and [build-system] tables (dependencies, console scripts),
# not the tool settings: a pytest or ruff edit must not cost a 6 GB rebuild. (No Python >= 3.12 to
# parse them: the whole files; the script stops below anyway.)
project_tables() {
  "$BASE_PY" -c 'import json, sys, tomllib
for f in sys.argv[1:]:
    d = tomllib.load(open(f, "rb"))
    print(json.dumps([d.get("project"), d.get("build-system")], sort_keys=True))' "$@" 2>/dev/null || cat "$@"
}
STAMP="$( (echo "$LEROBOT_SPEC $OURS_DEPS $PINS"; project_tables "$ROOT/pyproject.toml" "$ROOT/client/pyproject.toml") | sha256sum | cut -c1-16)"

build() {  # create once; rebuild when the package lists or the pyprojects' [project] tables change
  local dir="$SIDE/venv"
  if [ -x "$dir/bin/python" ] && [ "$(cat "$dir/.lerobot06-stamp" 2>/dev/null)" = "$STAMP" ]; then
    return 0
  fi
  echo "[lerobot06] building $dir on $BASE_PY ..." >&2
  rm -rf "$dir"
  "$BASE_PY" -m venv "$dir" || return 1
  local pip=("$dir/bin/python" -m pip install --quiet --disable-pip-version-check)
  { "${pip[@]}" --upgrade pip \
    && "${pip[@]}" "$LEROBOT_SPEC" $OURS_DEPS "$PINS" \
    && "${pip[@]}" "$ROOT/client" \
    && "${pip[@]}" --no-deps -e "$ROOT"; } 2>&1 | sed '/is ignored: it is neither a file nor a directory/d' >&2
  [ "${PIPESTATUS[0]}" -eq 0 ] || return 1
  echo "$STAMP" >"$dir/.lerobot06-stamp"
}

[ -x "$PY" ] || { echo "FAIL setup: $PY missing (run bash scripts/setup_env.sh, or set PROJECT_PYTHON)"; exit 1; }
# Training must run this checkout's code (a worktree sharing main's .venv imports main's otherwise).
PKG="$(cd / && "$PY" -c 'import os, dit4dit_npu; print(os.path.dirname(os.path.dirname(os.path.realpath(dit4dit_npu.__file__))))' 2>&1)"
[ "$PKG" = "$(pwd -P)" ] || { echo "FAIL setup: $PY imports dit4dit_npu from $PKG, not this checkout $(pwd -P) (run with PYTHONPATH=$ROOT:$ROOT/client)"; exit 1; }
[ -n "$BASE_PY" ] || { echo "FAIL setup: no Python >= 3.12 found (lerobot 0.6.1 needs it): set PYTHON312 to one"; exit 1; }
build || { echo "FAIL setup: cannot build the lerobot 0.6.1 side venv in $SIDE/venv"; exit 1; }
LR="$SIDE/venv/bin"
# the plugins (the policy, and the lean Meta-World env): wheels, not editable (lerobot finds plugins
# by their distribution's name, and a non-editable copy checks what a user's pip install gives),
# reinstalled when their sources differ from the installed copy's. Not on every run: a reinstall
# under a lerobot-eval still starting from this venv (another recipe's) would pull its modules away.
PLUGIN_STAMP="$(cd "$ROOT" && find lerobot_plugin -type f \( -name '*.py' -o -name '*.toml' -o -name '*.md' \) \
  -not -path '*/build/*' -not -path '*.egg-info/*' | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -c1-16)"
if [ "$(cat "$SIDE/venv/.plugins-stamp" 2>/dev/null)" != "$PLUGIN_STAMP" ]; then
  rm -f "$SIDE/venv/.plugins-stamp"
  "$LR/python" -m pip install --quiet --disable-pip-version-check --no-deps --force-reinstall "$ROOT/lerobot_plugin" \
    "$ROOT/lerobot_plugin/env" >"$SIDE/plugin_install.log" 2>&1 \
    || { echo "FAIL setup: pip install lerobot_plugin lerobot_plugin/env ($(tail -1 "$SIDE/plugin_install.log"))"; exit 1; }
  echo "$PLUGIN_STAMP" >"$SIDE/venv/.plugins-stamp"
fi
# The side venv must run this checkout's dit4dit_npu (an editable install of another checkout
# would check that one's code and pass); asked from outside the checkout.
PKG="$(cd / && "$LR/python" -c 'import os, dit4dit_npu; print(os.path.dirname(os.path.dirname(os.path.realpath(dit4dit_npu.__file__))))' 2>&1)"
[ "$PKG" = "$(pwd -P)" ] || { echo "FAIL setup: $LR/python imports dit4dit_npu from $PKG, not this checkout $(pwd -P)"; exit 1; }
# --build-only: the side venv with this checkout's plugins, nothing checked (scripts/metaworld_recipe.sh)
[ "${1:-}" = "--build-only" ] && exit 0
echo "[lerobot06] lerobot $("$LR/python" -c 'import lerobot; print(lerobot.__version__)' 2>/dev/null), torch $("$LR/python" -c 'import torch; print(torch.__version__)' 2>/dev/null), venv $(du -sh "$SIDE/venv" | cut -f1), work folder $WORK" >&2

rm -rf "$WORK" && mkdir -p "$WORK/logs" "$WORK/data"
TASK="${METAWORLD_TASK:-reach-v3}"
# --- Meta-World: what an episode costs, the experts' own success -----------------------------------
run_check "Meta-World cost" "$WORK/logs/metaworld_cost.log" "$LR/python" "$HERE/metaworld_side.py" cost \
  --tasks "${METAWORLD_COST_TASKS:-reach-v3,push-v3,drawer-open-v3,button-press-topdown-v3,window-open-v3}" \
  --episodes "${METAWORLD_COST_EPISODES:-3}" --size 480x480,224x224,128x128

# --- the lean env (--env.type=metaworld_lean): registered, sized, and the stock env's physics ---------
run_check "the lean Meta-World env" "$WORK/logs/metaworld_lean.log" "$LR/python" "$HERE/metaworld_side.py" lean --tasks "$TASK"

# eval_check ENV_TYPE NAME [ARGS...]: lerobot-eval of $POLICY for one episode of $TASK in ENV_TYPE
# (output and log named NAME), one PASS line with its time, success and reward, or one FAIL line.
# A policy of 2 steps on one demo drives the hand beyond the demo's state range, which the policy
# refuses by default (StateOutOfRangeError): the smoke acts on it, with a warning. lerobot-eval has
# no episode-length flag: an episode is 500 steps unless it succeeds.
eval_check() {
  local env_type="$1" name="$2" start info
  shift 2
  start=$(date +%s)
  run_check "lerobot-eval ($env_type)" "$WORK/logs/$name.log" "$LR/lerobot-eval" --policy.path="$POLICY" \
    --env.type="$env_type" --env.task="$TASK" "$@" --eval.n_episodes=1 --eval.batch_size=1 --policy.device=cpu \
    --policy.allow_out_of_range=true --output_dir="$WORK/$name" || return 0
  info="$WORK/$name/eval_info.json"
  if [ -f "$info" ]; then
    say "PASS lerobot-eval --policy.path=<our policy folder> --env.type=$env_type --env.task=$TASK: 1 episode in $(( $(date +%s) - start )) s, $("$LR/python" -c "import json, sys; o = json.load(open(sys.argv[1]))['overall']; print(f\"success {o['pc_success']:.0f}%, sum reward {o['avg_sum_reward']:.1f}\")" "$info" 2>&1)"
  else
    say "FAIL lerobot-eval ($env_type) wrote no eval_info.json (log: $WORK/logs/$name.log)"
  fi
}

# --- the Meta-World smoke: 1 expert demo -> 2 training steps -> lerobot's plugin check + lerobot-eval
if run_check "Meta-World demos" "$WORK/logs/demos.log" "$LR/python" "$HERE/metaworld_side.py" demos \
  --tasks "$TASK" --episodes 1 --size 128x128 --out "$WORK/data/reach_128"; then
  if "$PY" -m dit4dit_npu.train --config configs/metaworld/dit4dit_metaworld_tiny.yaml \
    datasets.vla_data.data_root_dir="$WORK/data" run_root_dir="$WORK/runs" run_id=metaworld_smoke \
    trainer.max_train_steps=2 trainer.save_interval=2 trainer.eval_interval=1000 trainer.logging_frequency=1 \
    >"$WORK/logs/train.log" 2>&1; then
    POLICY="$(ls -d "$WORK"/runs/metaworld_smoke/checkpoints/step_*/policy | sort | tail -1)"
    say "PASS our training: 2 steps of the tiny policy on the Meta-World demo (python -m dit4dit_npu.train, $(basename "$(dirname "$POLICY")"))"
    if run_check "dit4dit-lerobot-prepare" "$WORK/logs/prepare.log" "$LR/dit4dit-lerobot-prepare" --policy "$POLICY"; then
      say "PASS dit4dit-lerobot-prepare: $(tail -1 "$WORK/logs/prepare.log" | cut -d: -f1)"
      run_check "plugin" "$WORK/logs/plugin.log" "$LR/python" "$HERE/plugin_side.py" "$POLICY"
      eval_check metaworld lerobot_eval
      eval_check metaworld_lean lerobot_eval_lean --env.image_size=128  # the env the demos above were recorded in
    fi
  else
    say "FAIL our training on the Meta-World demo ($(tail -1 "$WORK/logs/train.log"))"
  fi
fi

echo "[lerobot06] $FAILS FAIL(s); logs in $WORK/logs" >&2
[ "$FAILS" -eq 0 ]
