#!/usr/bin/env bash
# Set up .venv (idempotent), run the linters (ruff, the import-layer contracts) and the test suite.
# Extra arguments go to pytest.
#   bash scripts/test.sh            the full tier, slow tests included (what CI runs)
#   bash scripts/test.sh --fast     the fast tier: -m "not slow" (unit + in-process tests, minutes)
# Tests run on $TEST_WORKERS pytest-xdist workers (default 2; each test file stays on one worker,
# tests/conftest.py's scheduler); `-n 0` among the arguments runs them in this process instead.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
args=(-n "${TEST_WORKERS:-2}")  # which tests share a worker: tests/conftest.py
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
.venv/bin/lint-imports  # the package's layers: [tool.importlinter] in pyproject.toml
bash scripts/check_disk.sh  # one line, not an hour of errors, when the disk is nearly full
.venv/bin/python -m pytest ${args[@]+"${args[@]}"}
