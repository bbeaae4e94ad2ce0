#!/usr/bin/env bash
# MR-GRPO training of DeepGen (see README "Training" and docs/training.md).
#
# Environment (all optional; defaults in brackets):
#   MODEL_CONFIG            [configs/models/deepgen_sd35m_qwen25vl3b.py]  (configs/models/deepgen_tiny.py on a laptop)
#   SD3_5_MODEL_NAME_OR_PATH, QWEN2_5_VL_MODEL_NAME_OR_PATH, CLIP_MODEL_NAME_OR_PATH   model weights (real config)
#   CHECKPOINT              DeepGen SFT checkpoint (.pth) to start from [none]
#   DATASET_CONFIG          [assets/rl_datasets/deepgen/deepgen_train.yaml]
#   EVAL_DATASET_CONFIG     [assets/rl_datasets/deepgen/eval/eval.yaml]   ("" disables evaluation)
#   SFTAUX_DATASET_CONFIG   [deepgen_rl/sft/configs/datasets/deepgen/t2i_grpo_moretextdata.py] ("" disables)
#   OCR_URL, UNIFIEDREWARD_THINK_URL, UNIGENBENCH_API_URL     reward / judge services (default localhost ports)
#   OUTPUT_DIR              [outputs/deepgen_rl_<date>]; when set it is reused and training resumes from its newest
#                           complete checkpoint; required (one shared path) when NNODES > 1
#   NNODES [1] NODE_RANK [0] MASTER_ADDR [127.0.0.1] MASTER_PORT [29700] NGPUS [GPUs on this node]
#   DEEPSPEED_CONFIG        [scripts/deepspeed/zero2.json on GPU, none on CPU]
#   REPORT_TO               [wandb,swanlab]; WANDB_MODE / SWANLAB_MODE [offline]; WANDB_PROJECT / SWANLAB_PROJ_NAME
# Extra command-line arguments are passed to python -m deepgen_rl.grpo_deepgen (e.g. --max_steps 100).
# Without CUDA the run is single-process on the CPU unless NGPUS is set (then torchrun with gloo).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
if [ -z "${VIRTUAL_ENV:-}" ] && [ -x "$ROOT/.venv/bin/python" ]; then
  # shellcheck disable=SC1091
  . "$ROOT/.venv/bin/activate"
fi

HAS_CUDA=$(python -c "import torch; print(int(torch.cuda.is_available()))" 2>/dev/null || echo 0)
NNODES="${NNODES:-1}"
if [ "$NNODES" != "1" ] && [ -z "${OUTPUT_DIR:-}" ]; then
  # every node would build its own timestamped folder: checkpoints and resume would split across them
  echo "[train.sh] NNODES=$NNODES needs OUTPUT_DIR set to the same shared path on every node" >&2
  exit 2
fi
NODE_RANK="${NODE_RANK:-0}"
MASTER_ADDR="${MASTER_ADDR:-127.0.0.1}"
MASTER_PORT="${MASTER_PORT:-29700}"
if [ "$HAS_CUDA" = "1" ]; then
  NGPUS="${NGPUS:-$(python -c 'import torch; print(torch.cuda.device_count())')}"
  DEEPSPEED_CONFIG="${DEEPSPEED_CONFIG-scripts/deepspeed/zero2.json}"
  PRECISION_ARGS=(--bf16 true)
else
  DEEPSPEED_CONFIG="${DEEPSPEED_CONFIG-}"
  PRECISION_ARGS=()
fi

MODEL_CONFIG="${MODEL_CONFIG:-configs/models/deepgen_sd35m_qwen25vl3b.py}"
DATASET_CONFIG="${DATASET_CONFIG:-assets/rl_datasets/deepgen/deepgen_train.yaml}"
EVAL_DATASET_CONFIG="${EVAL_DATASET_CONFIG-assets/rl_datasets/deepgen/eval/eval.yaml}"
SFTAUX_DATASET_CONFIG="${SFTAUX_DATASET_CONFIG-deepgen_rl/sft/configs/datasets/deepgen/t2i_grpo_moretextdata.py}"
OUTPUT_DIR="${OUTPUT_DIR:-outputs/deepgen_rl_$(date +%Y%m%d_%H%M%S)}"
REPORT_TO="${REPORT_TO:-wandb,swanlab}"
export WANDB_MODE="${WANDB_MODE:-offline}" SWANLAB_MODE="${SWANLAB_MODE:-offline}"
export WANDB_PROJECT="${WANDB_PROJECT:-DeepGen-RL}" SWANLAB_PROJ_NAME="${SWANLAB_PROJ_NAME:-DeepGen-RL}"
export WANDB_DIR="${WANDB_DIR:-$OUTPUT_DIR}" SWANLAB_LOG_DIR="${SWANLAB_LOG_DIR:-$OUTPUT_DIR/swanlog}"
export DEEPGEN_LOG_DIR="$OUTPUT_DIR/logs"

mkdir -p "$OUTPUT_DIR/logs" "$OUTPUT_DIR/configs"
for f in "$MODEL_CONFIG" "$DATASET_CONFIG" "$EVAL_DATASET_CONFIG" "$SFTAUX_DATASET_CONFIG" "$DEEPSPEED_CONFIG"; do
  if [ -n "$f" ] && [ -f "$f" ]; then cp "$f" "$OUTPUT_DIR/configs/"; fi
done

ARGS=(
  --model_config "$MODEL_CONFIG"
  --dataset_config "$DATASET_CONFIG"
  --output_dir "$OUTPUT_DIR"
  --num_train_epochs 10
  --lr_scheduler_type constant_with_warmup
  --report_to "$REPORT_TO"
  "${PRECISION_ARGS[@]}"
)
[ -n "${CHECKPOINT:-}" ] && ARGS+=(--checkpoint "$CHECKPOINT")
[ -n "$EVAL_DATASET_CONFIG" ] && ARGS+=(--eval_dataset_config "$EVAL_DATASET_CONFIG")
[ -n "$SFTAUX_DATASET_CONFIG" ] && ARGS+=(--sftaux_dataset_config "$SFTAUX_DATASET_CONFIG")
[ -n "$DEEPSPEED_CONFIG" ] && ARGS+=(--deepspeed "$DEEPSPEED_CONFIG")

if [ "$HAS_CUDA" = "1" ] || [ -n "${NGPUS:-}" ]; then
  NGPUS="${NGPUS:-1}"
  echo "[train.sh] torchrun: $NNODES node(s) x $NGPUS process(es), node rank $NODE_RANK, master $MASTER_ADDR:$MASTER_PORT"
  # --log-dir: torchrun's per-launch folders go into the run's logs (without it, every launch leaves a
  # /tmp/torchelastic_* folder behind)
  exec torchrun --nnodes "$NNODES" --node_rank "$NODE_RANK" --master_addr "$MASTER_ADDR" \
    --master_port "$MASTER_PORT" --nproc_per_node "$NGPUS" --log-dir "$OUTPUT_DIR/logs/torchrun" --no-python \
    bash scripts/utils/rank_tee.sh python -m deepgen_rl.grpo_deepgen "${ARGS[@]}" "$@"
else
  echo "[train.sh] no CUDA: single process on the CPU (set NGPUS=2 for a 2-process gloo run)"
  exec bash scripts/utils/rank_tee.sh python -m deepgen_rl.grpo_deepgen "${ARGS[@]}" "$@"
fi
