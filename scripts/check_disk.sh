#!/usr/bin/env bash
# Refuse, in one line, to start the tests on a nearly full disk. The tests write checkpoints under
# the temp folder (up to about 1.7 GB at once on a full run); with less free, every later test errors out,
# slowly, and the cause scrolls away. scripts/test.sh runs this after setting up .venv.
#   TEST_MIN_FREE_MB   the free space needed under $TMPDIR (default 3072)
set -euo pipefail
tmp="${TMPDIR:-/tmp}"
need="${TEST_MIN_FREE_MB:-3072}"
if ! [[ "$need" =~ ^[0-9]+$ ]]; then
  echo "scripts/check_disk.sh: TEST_MIN_FREE_MB=$need: expected a whole number of MB" >&2
  exit 2
fi
if [ ! -d "$tmp" ]; then
  echo "scripts/check_disk.sh: TMPDIR=$tmp: expected an existing folder" >&2
  exit 2
fi
free_mb=$(df -Pm "$tmp" | awk 'NR == 2 {print $4}')
if [ "$free_mb" -lt "$need" ]; then
  echo "scripts/check_disk.sh: $tmp has $free_mb MB free, the tests need $need (TEST_MIN_FREE_MB): free some disk first" >&2
  exit 2
fi
