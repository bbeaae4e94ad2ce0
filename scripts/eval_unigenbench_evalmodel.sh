#!/usr/bin/env bash
# Serve the UniGenBench judge (OpenAI-compatible chat completions) with vLLM.
#
#   bash scripts/eval_unigenbench_evalmodel.sh [--dry-run] [--tensor-parallel-size N] [-- extra vllm args]
#
# Environment:
#   UNIGENBENCH_MODEL          HF id or local path (default CodeGoat24/UniGenBench-EvalModel-qwen3vl-32b-v1)
#   UNIGENBENCH_MODEL_NAME     --served-model-name; the client's default is the same (UniGenBench-EvalModel)
#   UNIGENBENCH_HOST / _PORT   bind address (default 127.0.0.1:8000); clients use UNIGENBENCH_API_URL=http://HOST:PORT
#   VLLM_DATA_PARALLEL_SIZE    data-parallel replicas (default 1)
#   VLLM_TENSOR_PARALLEL_SIZE  GPUs per replica (default 1; --tensor-parallel-size overrides)
#   UNIGENBENCH_MAX_MODEL_LEN  optional --max-model-len
#   VLLM_GPU_MEMORY_UTILIZATION optional --gpu-memory-utilization
# --dry-run prints the exact command and exits 0 without starting anything.
set -euo pipefail

DRY_RUN=0
TP="${VLLM_TENSOR_PARALLEL_SIZE:-1}"
EXTRA=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --dry-run) DRY_RUN=1; shift ;;
    --tensor-parallel-size|--tp) TP="$2"; shift 2 ;;
    --tensor-parallel-size=*) TP="${1#*=}"; shift ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    --) shift; EXTRA+=("$@"); break ;;
    *) EXTRA+=("$1"); shift ;;
  esac
done

MODEL="${UNIGENBENCH_MODEL:-CodeGoat24/UniGenBench-EvalModel-qwen3vl-32b-v1}"
SERVED_NAME="${UNIGENBENCH_MODEL_NAME:-UniGenBench-EvalModel}"
HOST="${UNIGENBENCH_HOST:-127.0.0.1}"
PORT="${UNIGENBENCH_PORT:-8000}"
DP="${VLLM_DATA_PARALLEL_SIZE:-1}"

CMD=(vllm serve "$MODEL"
  --host "$HOST" --port "$PORT"
  --served-model-name "$SERVED_NAME"
  --data-parallel-size "$DP"
  --tensor-parallel-size "$TP"
  --trust-remote-code)
[[ -n "${UNIGENBENCH_MAX_MODEL_LEN:-}" ]] && CMD+=(--max-model-len "$UNIGENBENCH_MAX_MODEL_LEN")
[[ -n "${VLLM_GPU_MEMORY_UTILIZATION:-}" ]] && CMD+=(--gpu-memory-utilization "$VLLM_GPU_MEMORY_UTILIZATION")
CMD+=("${EXTRA[@]}")

if [[ "$DRY_RUN" == 1 ]]; then
  printf '%q ' "${CMD[@]}"; printf '\n'
  exit 0
fi
if ! command -v vllm >/dev/null 2>&1; then
  echo "error: 'vllm' is not installed or not on PATH; install it (pip install vllm) in the judge's environment" >&2
  exit 1
fi
echo "UniGenBench judge: http://${HOST}:${PORT}/v1 (model name ${SERVED_NAME}); set UNIGENBENCH_API_URL for clients" >&2
exec "${CMD[@]}"
