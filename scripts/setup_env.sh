#!/usr/bin/env bash
# Create/refresh the project virtualenv at .venv/ (idempotent: a second run only checks).
# Order matters: torch first, then wheel, then DeepSpeed with --no-build-isolation (its sdist
# imports torch at build time), then the robot-side client package (client/, a dependency of
# this one, not on any index), then this package in editable mode with the dev and sim extras.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PY="${PYTHON:-python3}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.14.1 torchvision==0.29.1}"
STAMP="$VENV/.dit4dit-installed"
want="$(cat "$ROOT/pyproject.toml" "$ROOT/client/pyproject.toml" "$ROOT/scripts/setup_env.sh" | sha256sum | cut -c1-16)"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && [ -x "$VENV/bin/python" ]; then
  exit 0
fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check)
# Some hosts configure extra local package indexes that pip warns about once per package.
quiet() { "$@" 2>&1 | sed '/is ignored: it is neither a file nor a directory/d'; }
echo "[setup] installing torch ($TORCH_SPEC) into $VENV ..."
# shellcheck disable=SC2086
quiet "${PIP[@]}" $TORCH_SPEC wheel setuptools
echo "[setup] installing deepspeed (--no-build-isolation) ..."
quiet "${PIP[@]}" --no-build-isolation deepspeed
echo "[setup] installing dit4dit-client (client/: the robot side, no torch) ..."
quiet "${PIP[@]}" --no-build-isolation -e "$ROOT/client"
echo "[setup] installing dit4dit-npu[dev,sim] ..."
quiet "${PIP[@]}" --no-build-isolation -e "$ROOT[dev,sim]"
# The simulation renders offscreen; say so now (not halfway through the tests) if it cannot here.
if ! "$VENV/bin/python" -c "from dit4dit_npu.sim.backend import require_simulator; require_simulator()" 2>/dev/null; then
  echo "[setup] warning: MuJoCo cannot render offscreen here (dit4dit_npu.sim needs it): install" \
       "libegl1 libegl-mesa0 (MUJOCO_GL=egl, the default) or libosmesa6 and set MUJOCO_GL=osmesa"
fi
echo "$want" > "$STAMP"
echo "[setup] done: $VENV"
