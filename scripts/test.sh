#!/usr/bin/env bash
# Set up .venv (idempotent) and run the linter and the whole test suite (slow tests included).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup_env.sh
export OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 DS_ACCELERATOR=cpu
.venv/bin/ruff check .
.venv/bin/python -m pytest "$@"
