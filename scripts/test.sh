#!/usr/bin/env bash
# Run the test suite: builds/reuses .venv from the repo's own files, then runs pytest offline.
# Extra arguments go to pytest (e.g. bash scripts/test.sh tests/rl -x).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup_env.sh
# shellcheck disable=SC1091
. "${DEEPGEN_VENV:-$ROOT/.venv}/bin/activate"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
export WANDB_MODE="${WANDB_MODE:-offline}" SWANLAB_MODE="${SWANLAB_MODE:-disabled}"
export DEEPGEN_TINY_DIR="${DEEPGEN_TINY_DIR:-$ROOT/.cache/deepgen_tiny}"
export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$ROOT/.cache/torch_extensions}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
exec python -m pytest "$@"
