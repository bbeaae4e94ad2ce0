#!/usr/bin/env bash
# Quickstart (README's first command; the toy world, docs/toy_world.md): watch RL teach a text-to-image model to
# follow prompts, on a laptop CPU. bash scripts/quickstart_tiny.sh is the pipeline demo with the OCR service instead.
#   1. builds/reuses .venv (same as scripts/test.sh)
#   2. loads the pre-trained toy DeepGen (configs/models/deepgen_toy.py), or builds it once (announced, with progress
#      bars: ~6 minutes on one core, docs/toy_world.md; cached in $DEEPGEN_TOY_DIR)
#   3. trains it with MR-GRPO (cps_sde sampler, gdpo advantages) on toy-world prompts with the programmatic
#      toy_compositional reward, evaluating held-out compositions with ODE sampling (fixed seeds) at step 0 and every
#      QUICKSTART_EVAL_EVERY steps
#   4. writes outputs/quickstart/: checkpoint, samples_before_after.png (held-out prompts, each image with its checker
#      verdict), accuracy_curve.png, reward_curve.png, report.html
# The toy world needs no reward service (no OCR: it would read nothing in images of coloured shapes).
# Env: QUICKSTART_STEPS (30), QUICKSTART_EVAL_EVERY (10), QUICKSTART_OUTPUT_DIR (outputs/quickstart).
# DEEPGEN_TOY_VARIANT=slots runs the prompt-following setting of docs/toy_world.md ("Prompt following on the slots
# variant") instead: the `slots` toy model (built once, ~10 minutes on one core), 1,024 images per step with the SFT
# anchor (4,096 train-split pairs written to $QUICKSTART_OUTPUT_DIR/sftaux) and --skip_zero_advantage, 10 steps by
# default (~34 s each on one thread; 6 min 22 s in all with the model cached), evaluated every 5. Other variants
# run the default flags.
# Rerunning is safe: the previous outputs/quickstart is replaced.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# shellcheck source=scripts/quickstart_env.sh
. scripts/quickstart_env.sh
VARIANT="${DEEPGEN_TOY_VARIANT:-default}"
OUT="${QUICKSTART_OUTPUT_DIR:-outputs/quickstart}"

rm -rf "$OUT"
mkdir -p "$OUT/logs"

python -c "from deepgen_rl.toy.model import ensure_toy_deepgen, read_meta
p = ensure_toy_deepgen(); m = read_meta(p['root'])
print(f\"[quickstart] toy DeepGen ready in {p['root']} (build took {m.get('build_wall_s', '?')} s wall, {m.get('build_cpu_s', '?')} s CPU)\")"

# Per-variant steps and flags (the rest below are shared). slots: docs/toy_world.md, "Prompt following on the slots
# variant".
STEPS="${QUICKSTART_STEPS:-30}"
EVAL_EVERY="${QUICKSTART_EVAL_EVERY:-10}"
VARIANT_FLAGS=(--sftaux_coef 0)
if [ "$VARIANT" = slots ]; then
  STEPS="${QUICKSTART_STEPS:-10}"
  EVAL_EVERY="${QUICKSTART_EVAL_EVERY:-5}"
  echo "[quickstart] slots: writing the SFT anchor's 4,096 train-split pairs to $OUT/sftaux"
  python -m deepgen_rl.toy.sftaux --variant slots --n 4096 --out "$OUT/sftaux" > /dev/null
  VARIANT_FLAGS=(--rollout_global_batch_size 1024 --skip_zero_advantage true --sftaux_coef 0.003
                 --sftaux_micro_batch_size 256 --sftaux_dataset_config "$OUT/sftaux/toy_sftaux.py")
fi

echo "[quickstart] training the toy DeepGen ($VARIANT) for $STEPS MR-GRPO steps on the CPU (eval every $EVAL_EVERY steps)"
python -m deepgen_rl.grpo_deepgen \
  --model_config configs/models/deepgen_toy.py \
  --dataset_config assets/rl_datasets/toy/toy_rl.yaml \
  --eval_dataset_config assets/rl_datasets/toy/eval/eval_toy.yaml \
  --output_dir "$OUT" \
  --max_steps "$STEPS" --save_steps "$STEPS" --save_total_limit 1 \
  --rollout_n 8 --rollout_micro_batch_size 64 --atrain_micro_batch_size 64 \
  --num_inference_steps 8 --image_height 64 --image_width 64 \
  --learning_rate 3e-4 --clip_range 0.2 --beta 0 --sde_eta 0.7 --warmup_steps 0 \
  --reward_kwargs '{"toy_compositional": {"exclusive": true}}' \
  --gradient_checkpointing false "${VARIANT_FLAGS[@]}" \
  --eval_freq "$EVAL_EVERY" --eval_at_start true --eval_judge false --log_images_every 10 \
  --report_to none --disable_tqdm true --seed 0 2>&1 | tee "$OUT/logs/train.log" \
  | grep --line-buffered -E "reward/toy_compositional|saved|WARNING|Error" \
  | sed -u -E "s/.*'reward\/toy_compositional': '([^']*)'.*'time\/step_s': '([^']*)'.*/  reward=\1  step_s=\2/"

echo "[quickstart] writing the report"
python -m deepgen_rl.toy.quickstart --output_dir "$OUT"
echo "[quickstart] done: open $OUT/report.html"
