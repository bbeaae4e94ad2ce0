#!/usr/bin/env bash
# Create (or reuse) the project virtual environment in .venv and install everything from the repo's own files.
# torch goes first: on a machine without CUDA the CPU build (TORCH_VERSION, default 2.13.0); on GPU nodes install your
# CUDA build of torch into the venv first (or set TORCH_SPEC, e.g. TORCH_SPEC="torch==2.13.0" with your index) and it is kept.
# Then the pinned requirements are installed with a constraints file that pins the installed torch, so pip never
# replaces it with another build.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${DEEPGEN_VENV:-$ROOT/.venv}"
PYTHON="${PYTHON:-python3}"
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
STAMP="$VENV/.deepgen_rl_installed"

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup_env] creating virtual environment at $VENV"
  "$PYTHON" -m venv "$VENV"
fi
# shellcheck disable=SC1091
. "$VENV/bin/activate"

req_hash="$(cat "$ROOT/requirements.txt" "$ROOT/setup.py" "$ROOT/scripts/setup_env.sh" | sha256sum | cut -d' ' -f1)"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$req_hash" ]; then
  echo "[setup_env] environment up to date ($VENV)"
  exit 0
fi

if ! python -c "import torch" >/dev/null 2>&1; then
  if [ -n "${TORCH_SPEC:-}" ]; then
    echo "[setup_env] installing $TORCH_SPEC"
    pip install "$TORCH_SPEC"
  else
    echo "[setup_env] installing torch==$TORCH_VERSION (CPU build where no CUDA build is provided)"
    pip install "torch==$TORCH_VERSION"
  fi
fi
installed_torch="$(python -c 'import torch; print(torch.__version__.split("+")[0])')"
constraints="$(mktemp)"
trap 'rm -f "$constraints"' EXIT
echo "torch==$installed_torch" > "$constraints"
echo "[setup_env] installing pinned requirements (torch pinned to $installed_torch)"
pip install -r "$ROOT/requirements.txt" -c "$constraints"
# xtuner is used only by a test that proves converted checkpoints load with its guess_load_checkpoint; it pins
# transformers 4.48, so it is installed without its dependencies and is never imported at run time.
pip install --no-deps "xtuner==0.2.0"
pip install --no-deps -e "$ROOT"
echo "$req_hash" > "$STAMP"
echo "[setup_env] done ($VENV)"
