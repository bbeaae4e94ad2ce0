#!/usr/bin/env bash
# Start the reward server hosting registered rewards, e.g.
#   PICKSCORE_MODEL_NAME_OR_PATH=/w/PickScore_v1 PICKSCORE_PROCESSOR_NAME_OR_PATH=/w/CLIP-ViT-H-14 \
#   bash scripts/reward_server.sh --reward pickscore --reward aesthetic \
#        --reward_kwargs '{"aesthetic": {"head_path": "/w/sac+logos+ava1-l14-linearMSE.pth"}}' --devices cuda:0,cuda:1
# Env: REWARD_HOST (127.0.0.1) REWARD_PORT (18090) REWARD_WORKERS (1) REWARD_THREADS (2) REWARD_MAX_BATCH (32)
#      REWARD_MAX_IMAGES REWARD_MAX_IMAGE_BYTES REWARD_MAX_IMAGE_PIXELS REWARD_MAX_REQUEST_PIXELS REWARD_MAX_BODY_BYTES
#      REWARD_HEADER_TIMEOUT_S REWARD_BODY_TIMEOUT_S REWARD_API_TOKEN (optional bearer token). See docs/rewards.md.
# Trainers use it with --reward_kwargs '{"pickscore": {"remote_url": "http://<host>:<port>"}}'.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
if [[ -z "${VIRTUAL_ENV:-}" && -f "${DEEPGEN_VENV:-$ROOT/.venv}/bin/activate" ]]; then
  # shellcheck disable=SC1091
  . "${DEEPGEN_VENV:-$ROOT/.venv}/bin/activate"
fi
export REWARD_HOST="${REWARD_HOST:-127.0.0.1}" REWARD_PORT="${REWARD_PORT:-18090}"
echo "reward server on http://${REWARD_HOST}:${REWARD_PORT}" >&2
exec python -m deepgen_rl.services.reward "$@"
