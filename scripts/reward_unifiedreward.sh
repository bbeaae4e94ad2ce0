#!/usr/bin/env bash
# Serve UnifiedReward-Think with vLLM's OpenAI-compatible server (the `unifiedreward_think` reward's backend).
#   bash scripts/reward_unifiedreward.sh [--dry-run] [extra vllm serve args...]
# Env: UNIFIEDREWARD_MODEL (CodeGoat24/UnifiedReward-Think-qwen3vl-8b), UNIFIEDREWARD_HOST (127.0.0.1),
#      UNIFIEDREWARD_PORT (18087), UNIFIEDREWARD_MODEL_NAME (served name, UnifiedReward),
#      VLLM_PARALLEL_MODE (dp|tp, default dp), VLLM_DATA_PARALLEL_SIZE / VLLM_TENSOR_PARALLEL_SIZE (default: number of
#      visible GPUs, else 1), VLLM_GPU_MEMORY_UTILIZATION (0.9), VLLM_MAX_MODEL_LEN (16384), REWARD_API_TOKEN
#      (optional; passed as --api-key). Trainers reach it at UNIFIEDREWARD_THINK_URL=http://<host>:<port>.
# --dry-run prints the exact command (shell-quoted; the token shown as "$REWARD_API_TOKEN") and exits 0 without vLLM.
set -euo pipefail

DRY_RUN=0
EXTRA=()
for arg in "$@"; do
  if [[ "$arg" == "--dry-run" ]]; then DRY_RUN=1; else EXTRA+=("$arg"); fi
done

count_gpus() {
  if [[ -n "${CUDA_VISIBLE_DEVICES+x}" ]]; then
    local list="${CUDA_VISIBLE_DEVICES// /}"
    if [[ -z "$list" || "$list" == "-1" ]]; then echo 0; else awk -F, '{print NF}' <<<"$list"; fi
  elif command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true
  else
    echo 0
  fi
}

MODEL="${UNIFIEDREWARD_MODEL:-CodeGoat24/UnifiedReward-Think-qwen3vl-8b}"
HOST="${UNIFIEDREWARD_HOST:-127.0.0.1}"
PORT="${UNIFIEDREWARD_PORT:-18087}"
SERVED_NAME="${UNIFIEDREWARD_MODEL_NAME:-UnifiedReward}"
MODE="${VLLM_PARALLEL_MODE:-dp}"
NGPU="$(count_gpus)"
(( NGPU >= 1 )) || NGPU=1

CMD=(vllm serve "$MODEL" --host "$HOST" --port "$PORT" --served-model-name "$SERVED_NAME"
     --gpu-memory-utilization "${VLLM_GPU_MEMORY_UTILIZATION:-0.9}" --max-model-len "${VLLM_MAX_MODEL_LEN:-16384}"
     --limit-mm-per-prompt '{"image":2}')
case "$MODE" in
  dp) CMD+=(--data-parallel-size "${VLLM_DATA_PARALLEL_SIZE:-$NGPU}" --tensor-parallel-size 1) ;;
  tp) CMD+=(--tensor-parallel-size "${VLLM_TENSOR_PARALLEL_SIZE:-$NGPU}" --data-parallel-size 1) ;;
  *) echo "reward_unifiedreward.sh: VLLM_PARALLEL_MODE must be dp or tp, got '$MODE'" >&2; exit 2 ;;
esac
CMD+=("${EXTRA[@]}")

if (( DRY_RUN )); then
  printf '%q' "${CMD[0]}"; printf ' %q' "${CMD[@]:1}"
  # The token is a secret: show where it goes, not its value.
  if [[ -n "${REWARD_API_TOKEN:-}" ]]; then printf ' --api-key "$REWARD_API_TOKEN"'; fi
  printf '\n'
  exit 0
fi
if [[ -n "${REWARD_API_TOKEN:-}" ]]; then CMD+=(--api-key "$REWARD_API_TOKEN"); fi
if ! command -v vllm >/dev/null 2>&1; then
  echo "reward_unifiedreward.sh: 'vllm' is not installed (pip install vllm on a GPU node); use --dry-run to see the command" >&2
  exit 127
fi
exec "${CMD[@]}"
