#!/usr/bin/env bash
# Serve the UniGenBench judge (OpenAI-compatible chat completions) with vLLM.
#
#   bash scripts/eval_unigenbench_evalmodel.sh [--mode project|official] [--dry-run] [--tensor-parallel-size N] \
#       [-- extra vllm args]
#
# --mode project (default): served name UniGenBench-EvalModel, data/tensor parallel from the env (1 and 1).
# --mode official: served the way the official UniGenBench launcher does: served name QwenVL, tensor parallel 8
#   (4 when the model id contains 72b), --pipeline-parallel-size 1, --limit-mm-per-prompt.image 2,
#   --gpu-memory-utilization 0.9. Score with the official protocol: --official_repo (the client then defaults to the
#   model name QwenVL). The host stays 127.0.0.1 and the port 8000 (the official script uses localhost:8080).
# Environment:
#   UNIGENBENCH_SERVE_MODE     project | official (--mode overrides)
#   UNIGENBENCH_MODEL          HF id or local path (default CodeGoat24/UniGenBench-EvalModel-qwen3vl-32b-v1)
#   UNIGENBENCH_MODEL_NAME     --served-model-name; default UniGenBench-EvalModel (project) or QwenVL (official),
#                              the same defaults as the client (deepgen_rl.evaluation.unigenbench.SERVED_MODEL_NAMES)
#   UNIGENBENCH_HOST / _PORT   bind address (default 127.0.0.1:8000); clients use UNIGENBENCH_API_URL=http://HOST:PORT
#   VLLM_DATA_PARALLEL_SIZE    data-parallel replicas (project default 1; official: not passed unless set)
#   VLLM_TENSOR_PARALLEL_SIZE  GPUs per replica (project default 1, official 8 or 4; --tensor-parallel-size overrides)
#   UNIGENBENCH_MAX_MODEL_LEN  optional --max-model-len
#   VLLM_GPU_MEMORY_UTILIZATION optional --gpu-memory-utilization (official default 0.9)
# --dry-run prints the exact command and exits 0 without starting anything.
set -euo pipefail

DRY_RUN=0
MODE="${UNIGENBENCH_SERVE_MODE:-project}"
TP="${VLLM_TENSOR_PARALLEL_SIZE:-}"
EXTRA=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --dry-run) DRY_RUN=1; shift ;;
    --mode) MODE="${2:-}"; shift 2 ;;
    --mode=*) MODE="${1#*=}"; shift ;;
    --tensor-parallel-size|--tp) TP="$2"; shift 2 ;;
    --tensor-parallel-size=*) TP="${1#*=}"; shift ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    --) shift; EXTRA+=("$@"); break ;;
    *) EXTRA+=("$1"); shift ;;
  esac
done

MODEL="${UNIGENBENCH_MODEL:-CodeGoat24/UniGenBench-EvalModel-qwen3vl-32b-v1}"
HOST="${UNIGENBENCH_HOST:-127.0.0.1}"
PORT="${UNIGENBENCH_PORT:-8000}"

case "$MODE" in
  project)
    SERVED_NAME="${UNIGENBENCH_MODEL_NAME:-UniGenBench-EvalModel}"
    CMD=(vllm serve "$MODEL"
      --host "$HOST" --port "$PORT"
      --served-model-name "$SERVED_NAME"
      --data-parallel-size "${VLLM_DATA_PARALLEL_SIZE:-1}"
      --tensor-parallel-size "${TP:-1}"
      --trust-remote-code)
    [[ -n "${VLLM_GPU_MEMORY_UTILIZATION:-}" ]] && CMD+=(--gpu-memory-utilization "$VLLM_GPU_MEMORY_UTILIZATION")
    ;;
  official)
    SERVED_NAME="${UNIGENBENCH_MODEL_NAME:-QwenVL}"
    if [[ -z "$TP" ]]; then
      shopt -s nocasematch
      if [[ "$MODEL" == *72b* ]]; then TP=4; else TP=8; fi
      shopt -u nocasematch
    fi
    CMD=(vllm serve "$MODEL"
      --host "$HOST" --port "$PORT"
      --served-model-name "$SERVED_NAME"
      --trust-remote-code
      --gpu-memory-utilization "${VLLM_GPU_MEMORY_UTILIZATION:-0.9}"
      --tensor-parallel-size "$TP"
      --pipeline-parallel-size 1
      --limit-mm-per-prompt.image 2)
    [[ -n "${VLLM_DATA_PARALLEL_SIZE:-}" ]] && CMD+=(--data-parallel-size "$VLLM_DATA_PARALLEL_SIZE")
    ;;
  *)
    echo "error: --mode / UNIGENBENCH_SERVE_MODE must be 'project' or 'official', got '${MODE}'" >&2
    exit 2 ;;
esac
[[ -n "${UNIGENBENCH_MAX_MODEL_LEN:-}" ]] && CMD+=(--max-model-len "$UNIGENBENCH_MAX_MODEL_LEN")
CMD+=("${EXTRA[@]}")

if [[ "$DRY_RUN" == 1 ]]; then
  printf '%q ' "${CMD[@]}"; printf '\n'
  exit 0
fi
if ! command -v vllm >/dev/null 2>&1; then
  echo "error: 'vllm' is not installed or not on PATH; install it (pip install vllm) in the judge's environment" >&2
  exit 1
fi
echo "UniGenBench judge (${MODE} mode): http://${HOST}:${PORT}/v1 (model name ${SERVED_NAME}); set UNIGENBENCH_API_URL for clients" >&2
exec "${CMD[@]}"
