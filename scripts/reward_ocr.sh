#!/usr/bin/env bash
# Start the OCR reward service (FastAPI + uvicorn + rapidocr_onnxruntime).
# Env: OCR_HOST (127.0.0.1) OCR_PORT (18082) OCR_WORKERS (1 uvicorn process) OCR_THREADS (2 OCR threads per process)
#      OCR_ORT_THREADS (-1: onnxruntime default) OCR_MAX_IMAGES (64) OCR_MAX_IMAGE_BYTES OCR_MAX_IMAGE_PIXELS
#      OCR_MAX_BODY_BYTES OCR_MAX_PROMPT_CHARS OCR_MAX_PENDING_IMAGES REWARD_API_TOKEN (optional bearer token).
# Trainers reach it at OCR_URL=http://<host>:<port>. See docs/rewards.md.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
if [[ -z "${VIRTUAL_ENV:-}" && -f "${DEEPGEN_VENV:-$ROOT/.venv}/bin/activate" ]]; then
  # shellcheck disable=SC1091
  . "${DEEPGEN_VENV:-$ROOT/.venv}/bin/activate"
fi
export OCR_HOST="${OCR_HOST:-127.0.0.1}" OCR_PORT="${OCR_PORT:-18082}" OCR_WORKERS="${OCR_WORKERS:-1}"
echo "OCR reward service on http://${OCR_HOST}:${OCR_PORT} (${OCR_WORKERS} worker process(es))" >&2
exec python -m deepgen_rl.services.ocr.app "$@"
