#!/usr/bin/env bash
# Create/refresh the project virtualenv (idempotent: a second run only checks).
#
#   bash scripts/setup_env.sh [--system-site-packages | --no-venv] [--torch-only]
#
#   --system-site-packages  the virtualenv also sees $PYTHON's own packages: on an Ascend image,
#                           its torch + torch_npu (kept, never replaced from the registry)
#   --no-venv               install into $PYTHON's environment itself (e.g. the image's conda env)
#   --torch-only            stop once torch is settled and checked (nothing else is installed)
# Environment: PYTHON (the interpreter to build on; default python3), VENV (default .venv),
# TORCH_SPEC (installed only when the environment has no torch; default below).
#
# Order matters: pip itself first (an old pip's resolver, e.g. Python 3.10's bundled 23.0.1, can
# backtrack for tens of minutes on this dependency graph); then torch: an installed torch is kept,
# else TORCH_SPEC is installed; then the stack is checked (python -m dit4dit_npu.doctor --stack:
# torch imports, a torch_npu matches it, CANN is there) before anything builds against it; then
# wheel, DeepSpeed with --no-build-isolation (its sdist imports torch at build time), then the
# robot-side client package (client/, a dependency of this one, not on any index), then this
# package in editable mode with the dev and sim extras, always with torch pinned to the one kept.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
VENV="${VENV:-$ROOT/.venv}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.14.1 torchvision==0.29.1}"
site=""
no_venv=0
torch_only=0
for arg in "$@"; do
  case "$arg" in
    --system-site-packages) site="--system-site-packages" ;;
    --no-venv) no_venv=1 ;;
    --torch-only) torch_only=1 ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "setup_env.sh: unknown argument $arg (see --help)" >&2; exit 2 ;;
  esac
done
if [ "$no_venv" = 1 ] && [ -n "$site" ]; then
  echo "setup_env.sh: --no-venv and --system-site-packages exclude each other" >&2
  exit 2
fi

if [ "$no_venv" = 1 ]; then
  TARGET="$(command -v "$PY" || true)"
  [ -n "$TARGET" ] || { echo "setup_env.sh: PYTHON=$PY: not found" >&2; exit 2; }
  STAMP="$("$TARGET" -c 'import sys; print(sys.prefix)')/.dit4dit-installed"
else
  TARGET="$VENV/bin/python"
  STAMP="$VENV/.dit4dit-installed"
fi
version_of() {  # the installed version of a distribution in the target environment ('' if none)
  "$TARGET" -c 'import importlib.metadata as m, sys
try:
    print(m.version(sys.argv[1]))
except m.PackageNotFoundError:
    pass' "$1"
}
want="$(cat "$ROOT/pyproject.toml" "$ROOT/client/pyproject.toml" "$ROOT/scripts/setup_env.sh" | sha256sum | cut -c1-16) $site"
if [ "$torch_only" = 0 ] && [ -f "$STAMP" ] && [ -x "$TARGET" ] \
  && [ "$(cat "$STAMP")" = "$want torch=$(version_of torch)" ]; then
  exit 0
fi

if [ "$no_venv" = 0 ]; then
  if [ -x "$TARGET" ]; then
    has_site="$(sed -n 's/^include-system-site-packages *= *//p' "$VENV/pyvenv.cfg")"
    if [ "$has_site" != "$([ -n "$site" ] && echo true || echo false)" ]; then
      echo "setup_env.sh: $VENV exists with include-system-site-packages = $has_site; remove it (or choose" \
           "another VENV=) to build it ${site:-without --system-site-packages}" >&2
      exit 2
    fi
  else
    # shellcheck disable=SC2086
    "$PY" -m venv $site "$VENV"
  fi
fi
PIP=("$TARGET" -m pip install --quiet --disable-pip-version-check)
# Some hosts configure extra local package indexes that pip warns about once per package.
quiet() { "$@" 2>&1 | sed '/is ignored: it is neither a file nor a directory/d'; }

echo "[setup] upgrading pip in $("$TARGET" -c 'import sys; print(sys.prefix)') ..."
quiet "${PIP[@]}" --upgrade pip

torch_version="$(version_of torch)"
if [ -n "$torch_version" ]; then
  torch_npu_version="$(version_of torch_npu)"
  where="$("$TARGET" -c 'import importlib.util, os; print(os.path.dirname(importlib.util.find_spec("torch").origin))')"
  echo "[setup] keeping the installed torch $torch_version${torch_npu_version:+ and torch_npu $torch_npu_version}" \
       "($where): never replaced from the registry"
else
  echo "[setup] installing torch ($TORCH_SPEC) ..."
  # shellcheck disable=SC2086
  quiet "${PIP[@]}" $TORCH_SPEC
  torch_version="$(version_of torch)"
fi
# The stack before anything builds on it; stdlib only, so it runs from the source tree before the
# package is installed: torch_npu without CANN (which breaks `import torch`), a torch_npu of
# another torch, a missing CANN: one line each, with the fix.
if ! (cd "$ROOT" && "$TARGET" -m dit4dit_npu.doctor --stack); then
  echo "[setup] stopped: fix the FAIL line(s) above, then run this script again" >&2
  exit 1
fi
[ "$torch_only" = 1 ] && { echo "[setup] --torch-only: torch $torch_version is ready in $TARGET"; exit 0; }

# pip must never swap the torch it found for another release while resolving the rest.
CONSTRAINTS="$(mktemp)"
trap 'rm -f "$CONSTRAINTS"' EXIT
echo "torch==$torch_version" >"$CONSTRAINTS"
echo "[setup] installing wheel, setuptools, deepspeed (--no-build-isolation) ..."
quiet "${PIP[@]}" -c "$CONSTRAINTS" wheel setuptools
quiet "${PIP[@]}" -c "$CONSTRAINTS" --no-build-isolation deepspeed
echo "[setup] installing dit4dit-client (client/: the robot side, no torch) ..."
quiet "${PIP[@]}" -c "$CONSTRAINTS" --no-build-isolation -e "$ROOT/client"
echo "[setup] installing dit4dit-npu[dev,sim] ..."
quiet "${PIP[@]}" -c "$CONSTRAINTS" --no-build-isolation -e "$ROOT[dev,sim]"
# The simulation renders offscreen; say so now (not halfway through the tests) if it cannot here.
if ! "$TARGET" -c "from dit4dit_npu.sim.backend import require_simulator; require_simulator()" 2>/dev/null; then
  echo "[setup] warning: MuJoCo cannot render offscreen here (dit4dit_npu.sim needs it): install" \
       "libegl1 libegl-mesa0 (MUJOCO_GL=egl, the default) or libosmesa6 and set MUJOCO_GL=osmesa"
fi
echo "$want torch=$(version_of torch)" >"$STAMP"
echo "[setup] done: $TARGET (torch $(version_of torch))"
