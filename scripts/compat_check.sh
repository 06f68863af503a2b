#!/usr/bin/env bash
# Compatibility check (run by hand, like interop_check.sh; not CI): does this project work on the
# stack its Ascend users have? The DiT4DiT NPU port runs CANN 9.0.0 with Python 3.10, torch 2.7.1
# and torchvision 0.22.1 (Atlas 800T A3). This builds that stack in a side virtualenv with
# scripts/setup_env.sh itself (the users' path: pip upgraded first, then torch, then the rest), under
# .compat/ (git-ignored), and runs there:
#   the whole fast test tier (pytest -m "not slow" on $TEST_WORKERS pytest-xdist workers, default 2,
#   as scripts/test.sh --fast runs it), a short training of the tiny config (accelerate +
#   DeepSpeed ZeRO-2 on CPU, the demo data generated, a policy exported), and the doctor.
# One PASS/FAIL line each, with its duration; exit 1 on any FAIL. The minimums in pyproject.toml
# (Python, torch, torchvision) are what this check passed with.
# Usage: bash scripts/compat_check.sh     (PYTHON310=/path/to/python3.10, COMPAT_DIR=... to choose)
#   COMPAT_TESTS="tests/test_a.py tests/test_b.py"  only those files of the fast tier (a short check on
#   a busy host; the PASS line names the files, so a subset is never mistaken for the whole tier)
#   COMPAT_STEPS=20                                 training steps
#   TEST_WORKERS=2                                  pytest-xdist workers of the fast tier (0: in-process)
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
TORCH=2.7.1
VISION=0.22.1
DIR="${COMPAT_DIR:-$ROOT/.compat}"
VENV="$DIR/py310-torch$TORCH"
WORK="$DIR/work"
LOGS="$DIR/logs"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" HF_HUB_OFFLINE=1 WANDB_MODE=disabled PYTHONUNBUFFERED=1 DS_ACCELERATOR=cpu
FAILS=0
START=$SECONDS

say() { echo "$*"; case "$*" in FAIL*) FAILS=$((FAILS + 1)) ;; esac; }
last() { grep -v '^\s*$' "$1" | tail -1; }

python310() {  # PYTHON310, else pyenv's newest 3.10, else python3.10 on PATH: the first that runs
  local root candidate
  root="$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")"
  for candidate in ${PYTHON310:-} $(find "$root/versions" -maxdepth 3 -path '*/3.10.*/bin/python3.10' 2>/dev/null \
      | sort -rV) "$(command -v python3.10 || true)"; do
    if [ -n "$candidate" ] && "$candidate" -c 'import sys; assert sys.version_info[:2] == (3, 10)' 2>/dev/null; then
      echo "$candidate"
      return
    fi
  done
}

mkdir -p "$LOGS"
PY310="$(python310)"
if [ -z "$PY310" ]; then
  say "FAIL setup: no Python 3.10 found (pyenv install 3.10, or PYTHON310=/path/to/python3.10)"
  exit 1
fi

# --- the users' set-up ---------------------------------------------------------------------------
t=$SECONDS
if PYTHON="$PY310" VENV="$VENV" TORCH_SPEC="torch==$TORCH torchvision==$VISION" bash scripts/setup_env.sh \
  >"$LOGS/setup.log" 2>&1; then
  versions="$("$VENV/bin/python" -c '
import importlib.metadata as m, platform
print(f"Python {platform.python_version()}, " + ", ".join(f"{d} {m.version(d)}" for d in
      ("pip", "torch", "torchvision", "diffusers", "transformers", "accelerate", "deepspeed", "peft")))')"
  case "$versions" in
    *"torch $TORCH"*"torchvision $VISION"*) say "PASS setup: $versions (scripts/setup_env.sh, $((SECONDS - t)) s)" ;;
    *) say "FAIL setup: expected torch $TORCH and torchvision $VISION, got: $versions" ;;
  esac
else
  say "FAIL setup: scripts/setup_env.sh: $(last "$LOGS/setup.log") (log: $LOGS/setup.log)"
  echo "[compat] $FAILS FAIL(s) in $((SECONDS - START)) s; logs in $LOGS" >&2
  exit 1
fi
PY="$VENV/bin/python"

# --- the fast test tier --------------------------------------------------------------------------
t=$SECONDS
read -ra TESTS <<<"${COMPAT_TESTS:-}"
WORKERS="${TEST_WORKERS:-2}"  # which tests share a worker: tests/conftest.py (as scripts/test.sh)
scope="the whole fast tier on $WORKERS workers"
[ "${#TESTS[@]}" -gt 0 ] && scope="fast tier of ${TESTS[*]} on $WORKERS workers"
if "$PY" -m pytest -m "not slow" -n "$WORKERS" -q -p no:cacheprovider ${TESTS[@]+"${TESTS[@]}"} >"$LOGS/tests.log" 2>&1; then
  say "PASS fast tests: $(last "$LOGS/tests.log" | tr -d '=' | xargs), $scope ($((SECONDS - t)) s)"
else
  say "FAIL fast tests: $(last "$LOGS/tests.log" | tr -d '=' | xargs), $scope (log: $LOGS/tests.log)"
fi

# --- a short training ----------------------------------------------------------------------------
t=$SECONDS
rm -rf "$WORK" && mkdir -p "$WORK"
STEPS="${COMPAT_STEPS:-20}"
if (cd "$WORK" && "$PY" -m dit4dit_npu.train --config "$ROOT/configs/robotwin/dit4dit_robotwin_tiny.yaml" \
  run_root_dir=runs run_id=compat trainer.max_train_steps=$STEPS trainer.save_interval=$STEPS \
  trainer.eval_interval=$STEPS trainer.logging_frequency=5) >"$LOGS/train.log" 2>&1; then
  summary="$("$PY" - "$WORK/runs/compat" <<'EOF'
import json, math, sys
from pathlib import Path
run = Path(sys.argv[1])
rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
losses = [r["total_loss"] for r in rows if "total_loss" in r]
policy = sorted(run.glob("checkpoints/step_*/policy/policy.json"))
assert losses and all(math.isfinite(x) for x in losses), f"losses {losses}"
assert policy, "no exported policy"
print(f"total loss {losses[0]:.4f} -> {losses[-1]:.4f}, policy exported ({policy[-1].parent.relative_to(run)})")
EOF
)" && say "PASS training: $STEPS steps of the tiny config (ZeRO-2 on CPU), $summary ($((SECONDS - t)) s)" \
    || say "FAIL training: finished but $summary (log: $LOGS/train.log)"
else
  say "FAIL training: $(last "$LOGS/train.log") (log: $LOGS/train.log)"
fi

# --- the doctor ----------------------------------------------------------------------------------
t=$SECONDS
if (cd "$WORK" && "$PY" -m dit4dit_npu.doctor --config "$ROOT/configs/robotwin/dit4dit_robotwin_tiny.yaml" \
  run_root_dir=runs) >"$LOGS/doctor.log" 2>&1; then
  say "PASS doctor: $(grep -c '^PASS' "$LOGS/doctor.log") PASS, $(grep -c '^SKIP' "$LOGS/doctor.log") SKIP, $(grep -c '^WARN' "$LOGS/doctor.log") WARN ($((SECONDS - t)) s)"
else
  say "FAIL doctor: $(grep '^FAIL' "$LOGS/doctor.log" | head -1 || last "$LOGS/doctor.log") (log: $LOGS/doctor.log)"
fi

echo "[compat] $FAILS FAIL(s) in $((SECONDS - START)) s; logs in $LOGS" >&2
[ "$FAILS" -eq 0 ]
