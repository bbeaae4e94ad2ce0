#!/usr/bin/env bash
# Fetch the recipe's public prompt files and the four UniGenBench test CSVs into assets/rl_datasets/deepgen/, where
# deepgen_train.yaml and eval/eval.yaml expect them (source: deepgenteam/deepgen_rl at a pinned commit; every file is
# verified by its git blob id). Idempotent and resumable; on failure prints one line per failed file and exits 1,
# never leaving an unverified file in place; offline (the source unreachable) it stops at once with ONE line.
#   bash scripts/download_data.sh [--dest DIR] [--base-url URL] [--only FILE ...]
# Env: DEEPGEN_DATA_BASE_URL (a mirror of raw.githubusercontent.com/deepgenteam/deepgen_rl/<commit>), PYTHON.
# Needs only the Python standard library.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-$(command -v python3 || command -v python)}"
PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" exec "$PY" -m deepgen_rl.data.download "$@"
