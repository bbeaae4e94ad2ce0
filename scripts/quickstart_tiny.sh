#!/usr/bin/env bash
# The pipeline demo on the random tiny model (bash scripts/quickstart.sh is the toy world): every part of the system
# on a laptop CPU in a few minutes, images are noise.
#   1. builds/reuses .venv (same as scripts/test.sh) and the tiny random DeepGen model (cached)
#   2. starts the real OCR reward service in the background (stopped at exit, also on Ctrl-C)
#   3. trains the tiny model with MR-GRPO on the demo mixture (brightness reward on every prompt + OCR on text
#      prompts + the SFT-auxiliary loss on the demo image-caption set), one evaluation pass at the end
#   4. writes outputs/quickstart_tiny/: checkpoint, reward_curve.png, samples_before_after.png, report.html
# Env: QUICKSTART_STEPS (40), QUICKSTART_OUTPUT_DIR (outputs/quickstart_tiny), OCR_PORT (a free port).
# Rerunning is safe: the previous outputs/quickstart_tiny is replaced.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# shellcheck source=scripts/quickstart_env.sh
. scripts/quickstart_env.sh
STEPS="${QUICKSTART_STEPS:-40}"
OUT="${QUICKSTART_OUTPUT_DIR:-outputs/quickstart_tiny}"
OCR_PORT="${OCR_PORT:-$(python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}"
export OCR_URL="http://127.0.0.1:${OCR_PORT}"

rm -rf "$OUT"
mkdir -p "$OUT/logs"
OCR_PID=""
cleanup() {
  if [ -n "$OCR_PID" ] && kill -0 "$OCR_PID" 2>/dev/null; then
    kill "$OCR_PID" 2>/dev/null || true
    wait "$OCR_PID" 2>/dev/null || true
    echo "[quickstart] OCR service stopped"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "[quickstart] starting the OCR reward service on $OCR_URL (log: $OUT/logs/ocr_service.log)"
OCR_HOST=127.0.0.1 OCR_PORT="$OCR_PORT" OCR_THREADS=2 python -m deepgen_rl.services.ocr.app --log-level warning \
  > "$OUT/logs/ocr_service.log" 2>&1 &
OCR_PID=$!
for _ in $(seq 1 150); do
  if python -c "import sys, httpx; sys.exit(0 if httpx.get('$OCR_URL/health', timeout=1).status_code == 200 else 1)" 2>/dev/null; then
    break
  fi
  kill -0 "$OCR_PID" 2>/dev/null || { echo "[quickstart] the OCR service died; see $OUT/logs/ocr_service.log" >&2; exit 1; }
  sleep 0.2
done

echo "[quickstart] training the tiny DeepGen model for $STEPS MR-GRPO steps on the CPU"
python -m deepgen_rl.grpo_deepgen \
  --model_config configs/models/deepgen_tiny.py \
  --dataset_config assets/rl_datasets/demo/demo_train.yaml \
  --eval_dataset_config assets/rl_datasets/demo/eval/eval_demo.yaml \
  --sftaux_dataset_config assets/sftaux/demo.py \
  --output_dir "$OUT" \
  --max_steps "$STEPS" --save_steps "$STEPS" --save_total_limit 1 \
  --rollout_n 8 --rollout_micro_batch_size 16 --atrain_micro_batch_size 16 \
  --num_inference_steps 8 --image_height 64 --image_width 64 \
  --learning_rate 3e-3 --warmup_steps 0 --sde_eta 0.7 --clip_range 0.2 --beta 0 \
  --sftaux_coef 1e-4 --sftaux_micro_batch_size 4 \
  --eval_freq "$STEPS" --eval_judge false --log_images_every 10 \
  --report_to none --disable_tqdm true --seed 0 2>&1 | tee "$OUT/logs/train.log" | grep --line-buffered -E "reward/total|saved|WARNING|Error" \
  | sed -u -E "s/.*'reward\/total': '([^']*)'.*'time\/step_s': '([^']*)'.*/  reward\/total=\1  step_s=\2/"

echo "[quickstart] writing the report"
python -m deepgen_rl.quickstart --output_dir "$OUT" --model_config configs/models/deepgen_tiny.py --image_size 64 \
  --num_inference_steps 8
echo "[quickstart] done: open $OUT/report.html"
