#!/usr/bin/env bash
# Set up .venv (idempotent), run the linter and the test suite. Extra arguments go to pytest.
#   bash scripts/test.sh            the full tier, slow tests included (what CI runs)
#   bash scripts/test.sh --fast     the fast tier: -m "not slow" (unit + in-process tests, minutes)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
args=()
for arg in "$@"; do
  if [ "$arg" = "--fast" ]; then
    args+=(-m "not slow")
  else
    args+=("$arg")
  fi
done
bash scripts/setup_env.sh
export OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 DS_ACCELERATOR=cpu
.venv/bin/ruff check .
.venv/bin/python -m pytest ${args[@]+"${args[@]}"}
